# tuner profile 'fleet' for vLLM 0.33.0 (mi355x, llama-3.1-70b, tp=2, dp=1, replicas=4, router=prefix-aware; 8 GPU)
# cache-aware admission runs in tuner's scheduler plugin tuner.vllm_plugin.CacheAwareAsyncScheduler (vLLM 0.33.0 has no --cache-aware-admission-* flags (PR #54625 is unmerged)); `tuner export PROFILE --format plugin -o DIR` writes it as a folder for vLLM's environment
# the arguments of each of the 4 replicas; the router: tuner export PROFILE --format router
--tensor-parallel-size 2 \
--max-num-batched-tokens 16384 \
--max-num-seqs 1024 \
--long-prefill-token-threshold 0 \
--enable-chunked-prefill \
--scheduling-policy fcfs \
--scheduler-reserve-full-isl \
--watermark 0.0 \
--prefill-schedule-interval 1 \
--scheduler-cls tuner.vllm_plugin.CacheAwareAsyncScheduler \
--additional-config '{"cache_aware_admission_window": 16, "cache_aware_admission_threshold": 0.35}'
