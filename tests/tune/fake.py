"""An analytic stand-in for the trace replay, to test the study machinery in milliseconds.

The response surface is made up but shaped like the real trade-offs: a moderate admission
window (around 16) raises both p90 interactivity and throughput, a very large one costs
interactivity; a low threshold helps only a little; larger token budgets raise throughput
and cost interactivity; TTFT grows with the window, so ``ttft_p90_s<=2.0`` bounds it.
"""

from __future__ import annotations

import math
import time
from typing import Any

from tuner.perf.deployment import Deployment, Split
from tuner.sim.settings import SchedulerSettings
from tuner.tune.evaluate import Windows


class FakeEvaluator:
    def __init__(self, *, fingerprint: str = "fake-fingerprint-0001", delay_s: float = 0.0,
                 holdout: float = 0.25, stage1_fraction: float = 0.25,
                 holdout_scale: float = 0.97) -> None:
        self.windows = Windows.split(0.0, 3600.0, holdout=holdout, stage1_fraction=stage1_fraction)
        self.default_settings = SchedulerSettings.vllm_defaults(288)
        self.max_model_len = 131072
        self.known_metrics = ("p90_interactivity", "output_throughput_per_gpu",
                              "total_throughput_per_gpu", "ttft_p90_s", "prefix_cache_hit_rate",
                              "preemptions")
        self.fingerprint = fingerprint
        self.delay_s = delay_s
        self.holdout_scale = holdout_scale
        self.num_gpus = 8
        self.block_size = 16
        self.calls: list[tuple[dict[str, Any], str]] = []

    def spec(self) -> dict[str, Any]:
        return {"factory": "tests.tune.fake:FakeEvaluator", "trace_path": "fake.parquet",
                "trace_fingerprint": self.fingerprint,
                "target": {"hardware": "mi355x", "model": "llama-3.1-70b", "tp": 8, "dp": 1},
                "backend": "fake", "windows": self.windows.to_dict()}

    def evaluate(self, settings: SchedulerSettings, window: str) -> dict[str, Any]:
        self.calls.append((settings.to_dict(), window))
        if self.delay_s:
            time.sleep(self.delay_s)
        w = settings.cache_aware_admission_window
        th = settings.cache_aware_admission_threshold
        x = math.log2(w + 1)
        gain = math.exp(-((x - 4.0) / 1.5) ** 2) * (1.0 - 0.3 * abs(th - 0.3))
        budget = math.log2(settings.max_num_batched_tokens / 16384)
        interactivity = 12.5 * (1 + 0.03 * gain - 0.004 * max(x - 5, 0) ** 2 - 0.01 * budget)
        throughput = 8000 * (1 + 0.05 * gain + 0.01 * min(x, 6) / 6 + 0.02 * budget)
        scale = {"stage1": 1.02, "train": 1.0, "holdout": self.holdout_scale}[window]
        return {
            "p90_interactivity": round(interactivity * scale, 6),
            "output_throughput_per_gpu": round(throughput * scale, 6),
            "total_throughput_per_gpu": round(throughput * scale * 11, 6),
            "ttft_p90_s": round(1.0 + 0.02 * w, 6),
            "prefix_cache_hit_rate": round(0.9 + 0.01 * gain, 6),
            "preemptions": 0.0,
        }


class FleetFake(FakeEvaluator):
    """The fake surface, plus a deployment effect: smaller TP with more replicas gives
    more throughput per GPU and less interactivity; prefix-aware routing helps both."""

    def __init__(self) -> None:
        super().__init__()
        self.default_deployment = Deployment(Split(8))
        self.deployments: list[dict[str, Any] | None] = []

    def evaluate(self, settings: SchedulerSettings, window: str, *,
                 deployment: Deployment | None = None) -> dict[str, Any]:
        out = super().evaluate(settings, window)
        d = deployment or self.default_deployment
        self.deployments.append(d.to_dict())
        engines = d.split.engines
        prefix = d.router is not None and d.router.policy == "prefix-aware"
        out["output_throughput_per_gpu"] *= 1 + 0.1 * math.log2(engines) + 0.05 * prefix
        out["p90_interactivity"] *= 1 - 0.02 * math.log2(engines) + 0.03 * prefix
        if engines > 1:
            out["engines"] = [{"engine": i, "replica": i // d.split.dp,
                               "dp_rank": i % d.split.dp, "num_requests": 10 + i,
                               "prefix_cache_hit_rate": 0.5, "kv_usage_mean": 0.4,
                               "kv_usage_max": 0.9, "preemptions": 0, "num_steps": 100}
                              for i in range(engines)]
        return out
