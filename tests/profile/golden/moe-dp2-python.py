# tuner profile 'moe-dp2' for vLLM 0.33.0 (mi355x, deepseek-v3, tp=4, dp=2, replicas=1, expert parallel; 8 GPU)
# cache-aware admission is off (window 0): stock vLLM scheduler, no plugin needed
from vllm.config import SchedulerConfig

scheduler_kwargs = dict(
    max_num_batched_tokens=16384,
    max_num_seqs=512,
    long_prefill_token_threshold=0,
    enable_chunked_prefill=True,
    policy='fcfs',
    scheduler_reserve_full_isl=True,
    watermark=0.0,
    prefill_schedule_interval=1,
)
# the engine's parallel layout (ParallelConfig / EngineArgs fields):
parallel_kwargs = dict(
    tensor_parallel_size=4,
    data_parallel_size=2,
    enable_expert_parallel=True,
)
# max_model_len and is_encoder_decoder come from your model config:
# scheduler_config = SchedulerConfig(max_model_len=..., is_encoder_decoder=False, **scheduler_kwargs)
