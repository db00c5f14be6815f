"""A disaggregated replay's own figures, read from its ``pd_*`` counters (the records):
the TTFT split, each pool's utilisation, KV usage and hit rate, the transfers, and
throughput per GPU over both pools (docs/disaggregation.md)."""

from __future__ import annotations

from typing import Any

__all__ = ["PD_TTFT_PARTS", "pd_lines", "pd_summary"]

#: the TTFT split, in order (``tuner.sim.disagg.simulator.TTFT_PARTS``)
PD_TTFT_PARTS = ("prefill_queue", "prefill", "decode_queue", "transfer", "first_decode")


def pd_summary(counters: dict[str, float],
               api_server: dict[str, float] | None = None) -> dict[str, Any] | None:
    """The P/D block of a summary (None for an aggregated replay); ``api_server``, the
    summary's block of that name, adds the server's part to the TTFT split (client TTFT
    = the engine parts + what the server adds, ``tuner.perf.api_server``)."""
    if "pd_num_prefill" not in counters:
        return None
    c = counters
    gpus = {pool: int(c[f"pd_num_{pool}"] * c[f"pd_{pool}_tp"]) for pool in ("prefill", "decode")}
    pools = {}
    for pool in ("prefill", "decode"):
        q, h = c[f"pd_{pool}_prefix_cache_queries"], c[f"pd_{pool}_prefix_cache_hits"]
        pools[pool] = {"instances": int(c[f"pd_num_{pool}"]), "tp": int(c[f"pd_{pool}_tp"]),
                       "gpus": gpus[pool], "utilization": c[f"pd_{pool}_utilization"],
                       "kv_usage_mean": c[f"pd_{pool}_kv_usage_mean"],
                       "prefix_cache_hit_rate": h / q if q else float("nan")}
    total_gpus = sum(gpus.values())
    ttft = {part: {stat: c[f"pd_ttft_{part}_{stat}_s"] for stat in ("mean", "p50", "p90")}
            for part in PD_TTFT_PARTS}
    if api_server is not None:
        ttft["api_server"] = {"mean": api_server["added_ttft_mean_s"],
                              "p50": float("nan"), "p90": api_server["added_ttft_p90_s"]}
    return {
        "pools": pools, "ttft_split_s": ttft,
        "transfers": {"reads": int(c.get("pd_reads", 0)),
                      "blocks": int(c.get("pd_read_blocks", 0)),
                      "bytes": c.get("pd_read_bytes", 0.0),
                      "link_s": c.get("pd_read_link_s", 0.0),
                      "decode_local_hit_tokens": int(c.get("pd_decode_local_hit_tokens", 0))},
        "refused_at_decode": int(c.get("pd_refused_at_decode", 0)),
        "num_gpus": total_gpus,  # the summary's per-GPU throughput divides by these
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def pd_lines(block: dict[str, Any]) -> list[str]:
    """The block as printed lines under a replay's summary table."""
    pools, ttft = block["pools"], block["ttft_split_s"]
    lines = [f"disaggregated: {block['num_gpus']} GPUs over both pools (throughput per GPU "
             "above counts them all); pools, split and transfers over the whole replay"]
    for pool in ("prefill", "decode"):
        p = pools[pool]
        lines.append(f"  {pool} pool: {p['instances']} x TP {p['tp']}, utilisation "
                     f"{p['utilization']:.0%}, KV usage {p['kv_usage_mean']:.0%}, "
                     f"prefix-cache hit rate {p['prefix_cache_hit_rate']:.2f}")
    parts = ", ".join(f"{part.replace('_', ' ')} {_ms(ttft[part]['mean'])}"
                      for part in ttft)
    lines.append(f"  TTFT split (mean): {parts}")
    t = block["transfers"]
    lines.append(f"  KV transfers: {t['reads']:,} reads, {t['bytes'] / 1e9:,.2f} GB, "
                 f"decoder local hits {t['decode_local_hit_tokens']:,} tokens")
    if block["refused_at_decode"]:
        lines.append(f"  {block['refused_at_decode']:,} requests refused by the decode "
                     "pool (too long for its KV cache)")
    return lines
