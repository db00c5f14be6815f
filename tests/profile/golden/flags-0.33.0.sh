# tuner profile 'golden' for vLLM 0.33.0 (mi355x, llama-3.1-70b, tp=8, dp=1)
# cache-aware admission runs in tuner's scheduler plugin tuner.vllm_plugin.CacheAwareAsyncScheduler (vLLM 0.33.0 has no --cache-aware-admission-* flags (PR #54625 is unmerged)); `tuner export PROFILE --format plugin -o DIR` writes it as a folder for vLLM's environment
vllm serve meta-llama/Llama-3.1-70B-Instruct \
    --tensor-parallel-size 8 \
    --gpu-memory-utilization 0.92 \
    --max-model-len 131072 \
    --block-size 16 \
    --async-scheduling \
    --max-num-batched-tokens 16384 \
    --max-num-seqs 1024 \
    --long-prefill-token-threshold 0 \
    --enable-chunked-prefill \
    --scheduling-policy fcfs \
    --scheduler-reserve-full-isl \
    --watermark 0.02 \
    --prefill-schedule-interval 4 \
    --scheduler-cls tuner.vllm_plugin.CacheAwareAsyncScheduler \
    --additional-config '{"cache_aware_admission_window": 16, "cache_aware_admission_threshold": 0.35}'
