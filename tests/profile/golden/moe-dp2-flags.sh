# tuner profile 'moe-dp2' for vLLM 0.33.0 (mi355x, deepseek-v3, tp=4, dp=2, replicas=1, expert parallel; 8 GPU)
# cache-aware admission is off (window 0): stock vLLM scheduler, no plugin needed
vllm serve deepseek-ai/DeepSeek-V3 \
    --tensor-parallel-size 4 \
    --data-parallel-size 2 \
    --enable-expert-parallel \
    --gpu-memory-utilization 0.92 \
    --max-model-len 32768 \
    --block-size 16 \
    --async-scheduling \
    --max-num-batched-tokens 16384 \
    --max-num-seqs 512 \
    --long-prefill-token-threshold 0 \
    --enable-chunked-prefill \
    --scheduling-policy fcfs \
    --scheduler-reserve-full-isl \
    --watermark 0.0 \
    --prefill-schedule-interval 1
