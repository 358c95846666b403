#!/usr/bin/env bash
# The shipped drafters' pipeline, end to end: self-distillation data from both prompt sources,
# EAGLE 3 and EAGLE 3.1 trained side by side on the same batches with one recipe, then evaluated
# and shipped into assets/drafters with their model cards. Every stage resumes where it stopped.
# data/val (self-written, another seed) is held out: each save measures both drafters there.
# Usage: bash scripts/train-drafters.sh [cuda|cpu]   (the recipe is the same; cpu takes days)
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${1:-cuda}
PY=.venv/bin/python
bash scripts/setup.sh
$PY -m playground train data --out data/templates --prompts 4800 --batch 400 --device "$DEVICE"
$PY -m playground train data --out data/self --source self --prompts 4000 --batch 400 --seed 1 --device "$DEVICE"
$PY -m playground train data --out data/val --source self --prompts 192 --batch 48 --seed 7 --device "$DEVICE"
$PY -m playground train drafter --variant eagle3 eagle3.1 --out runs/eagle3 runs/eagle3.1 \
  --data data/templates data/self --steps 1740 --batch 32 --save-every 200 --device "$DEVICE" --val-data data/val
$PY -m playground train ship --runs runs/eagle3 runs/eagle3.1
