#!/usr/bin/env bash
# Set up and run the playground demo: streams one answer with EAGLE 3.1 speculative decoding.
# Usage: bash scripts/start.sh [generate options, e.g. --prompt "..." --drafter eagle3 --k 4]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
case " $* " in
  *" --prompt "*) ;;
  *) set -- --prompt "Explain speculative decoding in three sentences." "$@" ;;
esac
exec .venv/bin/python -m playground generate "$@"
