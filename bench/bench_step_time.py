#!/usr/bin/env python3
"""Cost of one ``RooflineStepTimeModel.step_time_s`` call (not a test: prints figures).

The twin calls it once per simulated step, about 200,000 times per simulated hour
of busy serving, so at the 300x real-time target (12 s of wall time per simulated
hour) the model's share is calls x cost / 12 s. Prints ns per call for a dense GQA,
an MoE+MLA and a sliding-window MoE model on decode, prefill and mixed batches,
against an empty loop, and that share.

With ``--aic`` (aiconfigurator-core installed) also the measured-table model
(``--step-time-source aic``) of the NVIDIA targets it covers.

Usage:  .venv/bin/python bench/bench_step_time.py [--calls N] [--aic]
"""

from __future__ import annotations

import argparse
import time

from tuner.sim.batch import StepBatch
from tuner.perf.hardware import load_hardware
from tuner.perf.models import load_model
from tuner.perf.step_time import RooflineStepTimeModel
from tuner.perf.target import Target

BATCHES = {
    "decode 128 x 8k": StepBatch.from_requests([(8191, 1)] * 128),
    "prefill 8192": StepBatch.from_requests([(0, 8192)]),
    "mixed 64 dec + 2k chunk": StepBatch.from_requests([(4000, 1)] * 64 + [(6000, 2048)]),
}
TARGETS = [("mi355x", "llama-3.1-70b", 8), ("mi355x", "deepseek-v3", 8),
           ("h200", "gpt-oss-120b", 1)]
AIC_TARGETS = [("h200", "llama-3.1-70b", 8), ("h200", "gpt-oss-120b", 1)]
STEPS_PER_SIM_HOUR = 200_000
WALL_S_PER_SIM_HOUR = 3600 / 300  # the replay target: 300x real time


def per_call_ns(fn, arg, calls: int) -> float:
    best = float("inf")
    for _ in range(3):  # best of three, in CPU time: the machine is shared
        t0 = time.process_time()
        for _ in range(calls):
            fn(arg)
        best = min(best, (time.process_time() - t0) / calls)
    return best * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--aic", action="store_true", help="also the measured-table model")
    args = ap.parse_args()
    empty = per_call_ns(lambda b: None, BATCHES["prefill 8192"], args.calls)
    print(f"empty call (loop + call overhead): {empty:7.0f} ns")
    worst = 0.0
    for hw, model, tp in TARGETS:
        m = RooflineStepTimeModel(load_hardware(hw), load_model(model), tp)
        for label, batch in BATCHES.items():
            ns = per_call_ns(m.step_time_s, batch, args.calls)
            worst = max(worst, ns)
            print(f"{model:>14} TP{tp} {hw:<7} {label:<24} {ns:7.0f} ns/call")
    if args.aic:
        from tuner.perf.presets import resolve_target

        for hw, model, tp in AIC_TARGETS:
            m = resolve_target(Target(hardware=hw, model=model, tp=tp,
                                      step_time_source="aic")).step_time
            for label, batch in BATCHES.items():
                ns = per_call_ns(m.step_time_s, batch, args.calls)
                worst = max(worst, ns)
                print(f"{model:>14} TP{tp} {hw:<7} {label:<24} {ns:7.0f} ns/call (aic)")
    share = STEPS_PER_SIM_HOUR * worst * 1e-9 / WALL_S_PER_SIM_HOUR
    print(f"worst case: {worst:.0f} ns/call = {STEPS_PER_SIM_HOUR * worst * 1e-9:.2f} s per "
          f"simulated hour = {share:.1%} of the 300x replay budget")


if __name__ == "__main__":
    main()
