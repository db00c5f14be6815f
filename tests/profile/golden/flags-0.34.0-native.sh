# tuner profile 'golden' for vLLM 0.34.0 (mi355x, llama-3.1-70b, tp=8, dp=1)
# flags checked against vLLM 0.33.0; 0.34.0 was not checked flag by flag
--max-num-batched-tokens 16384 \
--max-num-seqs 1024 \
--long-prefill-token-threshold 0 \
--enable-chunked-prefill \
--scheduling-policy fcfs \
--scheduler-reserve-full-isl \
--watermark 0.02 \
--prefill-schedule-interval 4 \
--cache-aware-admission-window 16 \
--cache-aware-admission-threshold 0.35
