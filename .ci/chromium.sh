#!/usr/bin/env bash
# Install Debian's headless Chromium for tests/report/test_browser.py (idempotent).
# Called from .ci/run; safe to run again: does nothing when chromium is already there.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    chromium --version 2>/dev/null || true
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
# The package lists may be stale on a fresh machine: update only if the first try fails.
$SUDO apt-get install -y chromium \
    || { $SUDO apt-get update && $SUDO apt-get install -y chromium; }
chromium --version
