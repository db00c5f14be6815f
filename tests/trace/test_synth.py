

def test_range_parameter_accepts_a_single_value() -> None:
    """--param system_prompt_tokens=256 gives an int; it means the range [256, 256]."""
    from tuner.trace import synthesize

    trace = synthesize("chat", duration_s=120, rate=2, seed=1, system_prompt_tokens=256)
    first_turns = [r for r in trace.requests() if r.turn == 1]
    assert first_turns
    # System prompt (256 tokens = 4 blocks of 64) + a user message: every first turn is
    # longer, and its first 4 blocks are one of the 3 system-prompt variants.
    assert all(r.input_len > 256 for r in first_turns)
    prefixes = {tuple(r.block_hashes[:4]) for r in first_turns}
    assert 1 <= len(prefixes) <= 3
    fifth = {r.block_hashes[4] for r in first_turns if len(r.block_hashes) > 4}
    assert len(fifth) > len(prefixes)  # the user text after the system prompt is not shared
