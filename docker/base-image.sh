#!/usr/bin/env bash
# Build a local Debian bookworm + Python 3.11 base image (local/py311) with debootstrap, for machines
# that cannot pull from a container registry. Where registries are reachable, use python:3.11-slim.
set -euo pipefail
IMAGE=${1:-local/py311}
if docker image inspect "$IMAGE" > /dev/null 2>&1; then echo "$IMAGE exists"; exit 0; fi
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
command -v debootstrap > /dev/null || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq debootstrap > /dev/null; }
ROOTFS=$(mktemp -d)
trap 'rm -rf "$ROOTFS"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates bookworm "$ROOTFS" \
    http://deb.debian.org/debian > /dev/null
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$IMAGE"
echo "built $IMAGE"
