# tuner profile 'moe-dp2' for vLLM 0.33.0 (mi355x, deepseek-v3, tp=4, dp=2, replicas=1, expert parallel; 8 GPU)
# cache-aware admission runs in tuner's scheduler plugin tuner.vllm_plugin.CacheAwareAsyncScheduler (vLLM 0.33.0 has no --cache-aware-admission-* flags (PR #54625 is unmerged)); `tuner export PROFILE --format plugin -o DIR` writes it as a folder for vLLM's environment
--tensor-parallel-size 4 \
--data-parallel-size 2 \
--enable-expert-parallel \
--max-num-batched-tokens 16384 \
--max-num-seqs 512 \
--long-prefill-token-threshold 0 \
--enable-chunked-prefill \
--scheduling-policy fcfs \
--scheduler-reserve-full-isl \
--watermark 0.0 \
--prefill-schedule-interval 1 \
--scheduler-cls tuner.vllm_plugin.CacheAwareAsyncScheduler \
--additional-config '{"cache_aware_admission_window": 0, "cache_aware_admission_threshold": 0.5}'
