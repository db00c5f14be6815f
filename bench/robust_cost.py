"""What the robust check costs: the README's main job tuned with ``--robust off`` and with
the default check (4 clock variants), side by side in one run.

    python bench/robust_cost.py [--trace traces/mooncake_synthetic.jsonl] [--variants 4]

Prints each run's wall time and stage timings and the ratio on / off. Not part of the test
run (docs/tuning.md quotes its output).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile

from click.testing import CliRunner

from tuner.cli import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAIN_JOB = ["--hardware", "mi355x", "--model", "llama-3.1-8b", "--tp", "1", "--space",
            "scheduler", "--trials", "12", "--survivors", "3", "--stage1-fraction", "0.1"]


def _tune(trace: pathlib.Path, out: pathlib.Path, extra: list[str]) -> dict:
    res = CliRunner().invoke(cli, ["tune", str(trace), *MAIN_JOB, *extra, "-o", str(out),
                                   "--json", "--no-progress"])
    if res.exit_code != 0:
        raise SystemExit(res.output)
    return json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(ROOT / "traces" / "mooncake_synthetic.jsonl"))
    ap.add_argument("--variants", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        trace = folder / "trace.parquet"
        res = CliRunner().invoke(cli, ["ingest", args.trace, "-o", str(trace)])
        if res.exit_code != 0:
            raise SystemExit(res.output)
        off = _tune(trace, folder / "off.yaml", ["--robust", "off"])
        on = _tune(trace, folder / "on.yaml", ["--clock-variants", str(args.variants)])
    for label, doc in (("--robust off", off), (f"--clock-variants {args.variants}", on)):
        t = doc["timings_s"]
        print(f"{label:<20} wall {doc['wall_s']:7.1f} s  stage1 {t['stage1_s']:6.1f}  stage2 "
              f"{t['stage2_s']:6.1f}  held-out {t['holdout_s']:6.1f}  robust "
              f"{t.get('robust_s', 0.0):6.1f}  pick trial {doc['recommended']['trial']}")
    verdict = (on.get("robust") or {}).get("candidates") or [{}]
    print(f"robust: {verdict[0].get('verdict', '-')}")
    print(f"ratio on / off: {on['wall_s'] / off['wall_s']:.2f}x wall")


if __name__ == "__main__":
    main()
