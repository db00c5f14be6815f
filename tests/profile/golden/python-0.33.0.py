# tuner profile 'golden' for vLLM 0.33.0 (mi355x, llama-3.1-70b, tp=8, dp=1)
# cache-aware admission runs in tuner's scheduler plugin tuner.vllm_plugin.CacheAwareAsyncScheduler (vLLM 0.33.0 has no --cache-aware-admission-* flags (PR #54625 is unmerged)); `tuner export PROFILE --format plugin -o DIR` writes it as a folder for vLLM's environment
from vllm.config import SchedulerConfig

scheduler_kwargs = dict(
    max_num_batched_tokens=16384,
    max_num_seqs=1024,
    long_prefill_token_threshold=0,
    enable_chunked_prefill=True,
    policy='fcfs',
    scheduler_reserve_full_isl=True,
    watermark=0.02,
    prefill_schedule_interval=4,
    scheduler_cls='tuner.vllm_plugin.CacheAwareAsyncScheduler',
)
# The plugin reads these from VllmConfig.additional_config (EngineArgs(additional_config=...)):
additional_config = {'cache_aware_admission_window': 16, 'cache_aware_admission_threshold': 0.35}
# max_model_len and is_encoder_decoder come from your model config:
# scheduler_config = SchedulerConfig(max_model_len=..., is_encoder_decoder=False, **scheduler_kwargs)
