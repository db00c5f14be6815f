# tuner profile 'golden' for vLLM 0.32.0 (mi355x, llama-3.1-70b, tp=8, dp=1)
# cache-aware admission runs in tuner's scheduler plugin tuner.vllm_plugin.CacheAwareAsyncScheduler (vLLM 0.32.0 has no --cache-aware-admission-* flags (PR #54625 is unmerged)); `tuner export PROFILE --format plugin -o DIR` writes it as a folder for vLLM's environment
# WARNING: vLLM 0.32.0 applies --prefill-schedule-interval only to data-parallel deployments; a single engine ignores it (fixed in 0.33.0)
# flags checked against vLLM 0.33.0; 0.32.0 was not checked flag by flag
# use: source THIS_FILE && vllm serve MODEL "${VLLM_SCHEDULER_ARGS[@]}"
VLLM_SCHEDULER_ARGS=(--max-num-batched-tokens 16384 --max-num-seqs 1024 --long-prefill-token-threshold 0 --enable-chunked-prefill --scheduling-policy fcfs --scheduler-reserve-full-isl --watermark 0.02 --prefill-schedule-interval 4 --scheduler-cls tuner.vllm_plugin.CacheAwareAsyncScheduler --additional-config '{"cache_aware_admission_window": 16, "cache_aware_admission_threshold": 0.35}')
# the plugin also reads its values from these variables when --additional-config lacks them:
export TUNER_CACHE_AWARE_ADMISSION_WINDOW=16
export TUNER_CACHE_AWARE_ADMISSION_THRESHOLD=0.35
