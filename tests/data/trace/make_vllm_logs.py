"""Writes the vLLM request-log fixtures (run once; the outputs are committed).

Token ids are random but fixed (seeded); turn 2 of a conversation repeats turn 1's
prompt and output, as a chat client does.
"""

import random
from pathlib import Path

HERE = Path(__file__).parent
rng = random.Random(7)
PARAMS = ("SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
          "temperature=0.7, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], stop_token_ids=[], "
          "bad_words=[], include_stop_str_in_output=False, ignore_eos=False, max_tokens={mt}, "
          "min_tokens=0, logprobs=None, prompt_logprobs=None, skip_special_tokens=True, "
          "spaces_between_special_tokens=True, truncate_prompt_tokens=None, structured_outputs=None, "
          "extra_args=None)")


def toks(n):
    return [rng.randrange(1000, 128000) for _ in range(n)]


sys_prompt = [128000, 128006, 9125, 128007] + toks(40)
p1 = sys_prompt + toks(30)          # 74 tokens
o1 = toks(37)
p2 = p1 + o1 + toks(25)             # 136 tokens: repeats p1 + o1
o2 = toks(20)
p3 = sys_prompt + toks(9)           # shares the system prompt only
o3 = toks(5)

new = [
    "(APIServer pid=2741) INFO 11-29 10:00:00 [api_server.py:1901] Starting vLLM API server 0 on http://0.0.0.0:8000",
    "(APIServer pid=2741) INFO 11-29 10:00:05 [logger.py:41] `--enable-log-requests` is set but the minimum log level is higher than DEBUG.",
    f"(APIServer pid=2741) DEBUG 11-29 10:00:12 [logger.py:68] Request chatcmpl-a1 details: prompt: 'You are a helpful assistant.\\nHi, params: trick', prompt_token_ids: {p1}, prompt_embeds shape: None.",
    f"(APIServer pid=2741) INFO 11-29 10:00:12 [logger.py:79] Received request chatcmpl-a1: params: {PARAMS.format(mt=512)}, lora_request: None.",
    '(APIServer pid=2741) INFO:     127.0.0.1:50312 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    f"(APIServer pid=2741) DEBUG 11-29 10:00:13 [logger.py:68] Request chatcmpl-b2 details: prompt: 'x', prompt_token_ids: {p3}, prompt_embeds shape: None.",
    f"(APIServer pid=2741) INFO 11-29 10:00:13 [logger.py:79] Received request chatcmpl-b2: params: {PARAMS.format(mt=64)}, lora_request: None.",
    f"(APIServer pid=2741) DEBUG 11-29 10:00:14 [logger.py:110] Generated response chatcmpl-a1 details: output_token_ids: {o1}",
    "(APIServer pid=2741) INFO 11-29 10:00:14 [logger.py:118] Generated response chatcmpl-a1: output: 'Hello! output_token_ids: [1, 2]', finish_reason: stop",
    "(EngineCore_DP0 pid=2790) INFO 11-29 10:00:15 [loggers.py:236] Engine 000: Avg prompt throughput: 21.0 tokens/s, Avg generation throughput: 4.2 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%, Prefix cache hit rate: 0.0%",
    f"(APIServer pid=2741) DEBUG 11-29 10:00:15 [logger.py:110] Generated response chatcmpl-b2 details: output_token_ids: {o3}",
    "(APIServer pid=2741) INFO 11-29 10:00:15 [logger.py:118] Generated response chatcmpl-b2: output: 'ok', finish_reason: length",
    f"(APIServer pid=2741) DEBUG 11-29 10:00:31 [logger.py:68] Request chatcmpl-c3 details: prompt: 'y', prompt_token_ids: {p2}, prompt_embeds shape: None.",
    f"(APIServer pid=2741) INFO 11-29 10:00:31 [logger.py:79] Received request chatcmpl-c3: params: {PARAMS.format(mt=512)}, lora_request: None.",
    f"(APIServer pid=2741) INFO 11-29 10:00:32 [logger.py:118] Generated response chatcmpl-c3 (streaming delta): output: 'Su', output_token_ids: {o2[:8]}, finish_reason: None",
    f"(APIServer pid=2741) INFO 11-29 10:00:33 [logger.py:118] Generated response chatcmpl-c3 (streaming delta): output: 're.', output_token_ids: {o2[8:]}, finish_reason: stop",
    "(APIServer pid=2741) INFO 11-29 10:00:33 [logger.py:118] Generated response chatcmpl-c3 (streaming complete): output: 'Sure.', output_token_ids: None, finish_reason: streaming_complete",
    f"(APIServer pid=2741) DEBUG 11-29 10:00:40 [logger.py:68] Request chatcmpl-d4 details: prompt: 'z', prompt_token_ids: {sys_prompt + toks(3)}, prompt_embeds shape: None.",
    f"(APIServer pid=2741) INFO 11-29 10:00:40 [logger.py:79] Received request chatcmpl-d4: params: {PARAMS.format(mt=512)}, lora_request: None.",
    f"(APIServer pid=2741) INFO 11-29 10:00:41 [logger.py:118] Generated response chatcmpl-d4 (streaming delta): output: 'a', output_token_ids: {toks(3)}, finish_reason: None",
    "(APIServer pid=2741) INFO 11-29 10:00:41 [async_llm.py:420] Aborted request(s) chatcmpl-d4.",
]
(HERE / "vllm_033_debug.log").write_text("\n".join(new) + "\n")

q1 = toks(50)
r1 = toks(20)
q2 = q1 + r1 + toks(10)
old = [
    "INFO 03-14 09:29:58 [launcher.py:29] Route: /v1/completions, Methods: POST",
    f"INFO 03-14 09:30:01 [logger.py:43] Received request cmpl-5d2a-0: prompt: 'Once upon a time', params: {PARAMS.format(mt=20)}, prompt_token_ids: {q1}, prompt_embeds shape: None, lora_request: None.",
    f"INFO 03-14 09:30:02 [logger.py:72] Generated response cmpl-5d2a-0: output: ' there was', output_token_ids: {r1}, finish_reason: length",
    f"INFO 03-14 09:30:04 [logger.py:43] Received request cmpl-77ef-0: prompt: 'Once upon a time there was', params: {PARAMS.format(mt=20)}, prompt_token_ids: {q2}, prompt_embeds shape: None, lora_request: None.",
    f"INFO 03-14 09:30:05 [logger.py:72] Generated response cmpl-77ef-0: output: ' a', output_token_ids: {toks(4)}, finish_reason: stop",
]
(HERE / "vllm_legacy_info.log").write_text("\n".join(old) + "\n")
