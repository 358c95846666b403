#!/usr/bin/env bash
# Set up and start the playground on http://0.0.0.0:7860 (embedded engine).
# Usage: bash scripts/start.sh [app.py options, e.g. --port 7861 --max-tokens 512]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python app.py "$@"
