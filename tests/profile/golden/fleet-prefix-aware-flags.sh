# tuner profile 'fleet' for vLLM 0.33.0 (mi355x, llama-3.1-70b, tp=2, dp=1, replicas=4, router=prefix-aware; 8 GPU)
# cache-aware admission runs in tuner's scheduler plugin tuner.vllm_plugin.CacheAwareAsyncScheduler (vLLM 0.33.0 has no --cache-aware-admission-* flags (PR #54625 is unmerged)); `tuner export PROFILE --format plugin -o DIR` writes it as a folder for vLLM's environment
# 4 replicas on one node, 2 GPU each; each engine in the background on its own GPUs and port
CUDA_VISIBLE_DEVICES=0,1 vllm serve meta-llama/Llama-3.1-70B-Instruct \
    --tensor-parallel-size 2 \
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
    --watermark 0.0 \
    --prefill-schedule-interval 1 \
    --scheduler-cls tuner.vllm_plugin.CacheAwareAsyncScheduler \
    --additional-config '{"cache_aware_admission_window": 16, "cache_aware_admission_threshold": 0.35}' \
    --port 8000 &
CUDA_VISIBLE_DEVICES=2,3 vllm serve meta-llama/Llama-3.1-70B-Instruct \
    --tensor-parallel-size 2 \
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
    --watermark 0.0 \
    --prefill-schedule-interval 1 \
    --scheduler-cls tuner.vllm_plugin.CacheAwareAsyncScheduler \
    --additional-config '{"cache_aware_admission_window": 16, "cache_aware_admission_threshold": 0.35}' \
    --port 8001 &
CUDA_VISIBLE_DEVICES=4,5 vllm serve meta-llama/Llama-3.1-70B-Instruct \
    --tensor-parallel-size 2 \
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
    --watermark 0.0 \
    --prefill-schedule-interval 1 \
    --scheduler-cls tuner.vllm_plugin.CacheAwareAsyncScheduler \
    --additional-config '{"cache_aware_admission_window": 16, "cache_aware_admission_threshold": 0.35}' \
    --port 8002 &
CUDA_VISIBLE_DEVICES=6,7 vllm serve meta-llama/Llama-3.1-70B-Instruct \
    --tensor-parallel-size 2 \
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
    --watermark 0.0 \
    --prefill-schedule-interval 1 \
    --scheduler-cls tuner.vllm_plugin.CacheAwareAsyncScheduler \
    --additional-config '{"cache_aware_admission_window": 16, "cache_aware_admission_threshold": 0.35}' \
    --port 8003 &
# router: NVIDIA Dynamo KV router (dynamo.frontend) (dynamo components/frontend (--router-mode kv), docs/design_docs/router_design.md)
# Dynamo's KV router needs KV events: start each engine as `python -m dynamo.vllm --model MODEL` with the engine flags above instead of `vllm serve` (Dynamo registers its workers itself; no backend list)
python -m dynamo.frontend \
    --http-port 8080 \
    --router-mode kv \
    --kv-overlap-score-weight 1.5 \
    --router-temperature 0 \
    --kv-cache-block-size 16
