"""Fidelity checks: how far the twin is from vLLM (step-by-step parity, ...)."""
