# tuner profile 'moe-dp2' for vLLM 0.33.0 (mi355x, deepseek-v3, tp=4, dp=2, replicas=1, expert parallel; 8 GPU)
# cache-aware admission is off (window 0): stock vLLM scheduler, no plugin needed
# use: source THIS_FILE && vllm serve MODEL "${VLLM_SCHEDULER_ARGS[@]}"
VLLM_SCHEDULER_ARGS=(--max-num-batched-tokens 16384 --max-num-seqs 512 --long-prefill-token-threshold 0 --enable-chunked-prefill --scheduling-policy fcfs --scheduler-reserve-full-isl --watermark 0.0 --prefill-schedule-interval 1)
# the engine's parallel layout: vllm serve MODEL "${VLLM_ENGINE_ARGS[@]}" "${VLLM_SCHEDULER_ARGS[@]}"
VLLM_ENGINE_ARGS=(--tensor-parallel-size 4 --data-parallel-size 2 --enable-expert-parallel)
