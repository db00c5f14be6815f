#!/usr/bin/env bash
# Regenerate the example profile from the bundled agentic trace (never edit the YAML by hand).
#
#   profiles/regenerate.sh                 # about 15-20 min on 2 CPU cores with 1 worker
#   TRIALS=200 WORKERS=8 profiles/regenerate.sh
#
# The study journal (profiles/agentic-mi355x.optuna-journal, git-ignored) makes a rerun
# resume instead of starting over; delete it to start from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."
TUNER="${TUNER:-.venv/bin/tuner}"
TRIALS="${TRIALS:-24}"
SURVIVORS="${SURVIVORS:-4}"
WORKERS="${WORKERS:-1}"
SEED="${SEED:-0}"
# The scheduler space (admission window and threshold plus batch caps, prefill chunking,
# cadence, watermark, full-prompt reservation): on this trace the admission window alone
# moves the metrics by ~0.1 %, the prefill-chunk settings by tens of percent.
# Block size: the hardware preset's default (16: vLLM 0.33.0 picks ROCM_ATTN for Llama on
# MI355X; see docs/step-time-model.md).
"$TUNER" tune traces/agentic_1h.parquet --hardware mi355x --model llama-3.1-70b --tp 8 \
    --space scheduler --trials "$TRIALS" --survivors "$SURVIVORS" \
    --workers "$WORKERS" --seed "$SEED" --holdout 0.25 --stage1-fraction 0.1 \
    --prefer throughput --no-progress -o profiles/agentic-mi355x.yaml
