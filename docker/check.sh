#!/usr/bin/env bash
# Build the Space image here and prove it works: the page loads and a prompt streams through the API.
# Needs Docker (Debian's docker.io); no registry access: the base image is built with debootstrap.
# Usage: bash docker/check.sh [--gpu] [image tag]
#   --gpu  the GPU variant (the official vllm package). With an NVIDIA GPU and the container toolkit it
#          runs with --gpus all and waits for the vLLM servers; without one it checks that vLLM imports
#          and that the page serves the embedded engine.
set -euo pipefail
cd "$(dirname "$0")/.."
GPU=; [ "${1:-}" = "--gpu" ] && { GPU=1; shift; }
TAG=${1:-eagle-playground:$([ -n "$GPU" ] && echo gpu || echo cpu)}
VLLM_VERSION=0.32.0
MAX_CPU_IMAGE_BYTES=2600000000   # the Space image's budget: the target, the drafters, torch and the kernels
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
command -v dockerd > /dev/null || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq docker.io > /dev/null; }
if ! docker info > /dev/null 2>&1; then
  ($SUDO dockerd > /tmp/dockerd.log 2>&1 &)
  for _ in $(seq 30); do docker info > /dev/null 2>&1 && break; sleep 1; done
fi
bash docker/base-image.sh local/py311
mkdir -p docker/wheels
cp -n /opt/wheels/torch-2.13.0+cpu-*.whl docker/wheels/ 2>/dev/null || true
cp /etc/ssl/certs/ca-certificates.crt docker/ca.crt
start=$(date +%s)
docker build --network host --build-arg BASE=local/py311 --build-arg TORCH_INDEX= --build-arg CA_BUNDLE=ca.crt \
    ${GPU:+--build-arg VLLM=$VLLM_VERSION} -t "$TAG" .
gb() { awk "BEGIN {printf \"%.2f GB\", $1 / 1e9}"; }
SIZE=$(docker image inspect "$TAG" --format '{{.Size}}')
echo "build: $(( $(date +%s) - start )) s, image size: $(gb "$SIZE")"
if [ -z "$GPU" ] && [ "$SIZE" -gt "$MAX_CPU_IMAGE_BYTES" ]; then
  echo "FAIL: the CPU image is over its $(gb "$MAX_CPU_IMAGE_BYTES") budget"
  exit 1
fi
NAME=eagle-playground-check
docker rm -f "$NAME" > /dev/null 2>&1 || true
if [ -n "$GPU" ]; then
  docker run --rm --network none "$TAG" /opt/vllm/bin/python -c "import vllm; print('vllm', vllm.__version__, 'imports')"
  if command -v nvidia-smi > /dev/null && nvidia-smi > /dev/null 2>&1; then
    docker run -d --name "$NAME" --gpus all --network none "$TAG" > /dev/null
    BACKEND=vllm
  else
    echo "no GPU here: running the GPU image with the embedded engine only (vLLM servers need a GPU)"
    docker run -d --name "$NAME" --network none -e PLAYGROUND_BACKEND= -e PLAYGROUND_VLLM_LAUNCH= "$TAG" > /dev/null
    BACKEND=reference
  fi
else
  # no network at all: proves nothing is downloaded at run time; the probe runs inside the container
  docker run -d --name "$NAME" --network none "$TAG" > /dev/null
  BACKEND=reference
fi
trap 'docker rm -f "$NAME" > /dev/null' EXIT
echo "runs as uid $(docker exec "$NAME" id -u)"
# the kernels built into the image load without a compiler (a fallback would be silently slower)
docker exec "$NAME" python -c "from playground.model import kernels; s = kernels.status(); print(s.note); assert s.loaded"
# ... and both vector widths are there: a Space whose CPU lacks AVX-512 loads the 8-float build
docker exec -e PLAYGROUND_CPU_VECTORS=avx2 "$NAME" python -c "from playground.model import kernels; s = kernels.status(); print(s.note); assert s.loaded"
docker cp docker/probe.py "$NAME:/tmp/probe.py"
docker exec "$NAME" python /tmp/probe.py http://127.0.0.1:7860 "$BACKEND"
docker exec "$NAME" python -m playground.healthcheck && echo "health check: healthy"
