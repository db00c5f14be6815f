#!/usr/bin/env bash
# Regenerate the example profile from the bundled agentic trace (never edit the YAML by hand).
#
#   profiles/regenerate.sh                 # about 10 min on 2 shared CPU cores, 1 worker
#   TRIALS=200 WORKERS=8 profiles/regenerate.sh
#
# The study journal (profiles/agentic-mi355x.optuna-journal, git-ignored) makes a rerun
# resume instead of starting over; delete it to start from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."
TUNER="${TUNER:-.venv/bin/tuner}"
TRIALS="${TRIALS:-100}"
SURVIVORS="${SURVIVORS:-10}"
WORKERS="${WORKERS:-1}"
SEED="${SEED:-0}"
# 64-token KV blocks: what vLLM uses on MI355X with ROCm AITER attention, and the trace's
# own hash block size (no re-blocking, a quarter of the memory of 16-token blocks).
"$TUNER" tune traces/agentic_1h.parquet --hardware mi355x --model llama-3.1-70b --tp 8 \
    --block-size 64 --space admission --trials "$TRIALS" --survivors "$SURVIVORS" \
    --workers "$WORKERS" --seed "$SEED" --holdout 0.25 --stage1-fraction 0.25 \
    --prefer throughput --no-progress -o profiles/agentic-mi355x.yaml
