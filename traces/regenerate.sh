#!/usr/bin/env bash
# Regenerates the synthesized bundled traces byte for byte (same tuner version, same
# pyarrow). The Mooncake sample is a copy of upstream data and is not regenerated.
# Override the knobs the lead may tune: RATE=16 traces/regenerate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TUNER="${TUNER:-.venv/bin/tuner}"
RATE="${RATE:-5}"
SEED="${SEED:-42}"
"$TUNER" trace synth --kind agentic --duration 1h --rate "$RATE" --seed "$SEED" \
    --hash-block-size 64 -o traces/agentic_1h.parquet
