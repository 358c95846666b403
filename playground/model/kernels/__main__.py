"""`python -m playground.model.kernels [--every-width]`: build the CPU kernels now (again, after a failed
build) and say what runs here; with --every-width, the other vector width too (an image runs on CPUs other
than the one that built it). Exits 1 when they should run on this CPU but do not."""

import logging
import sys

from playground.model.kernels import build_all, cpu_runs_them, load

logging.basicConfig(level=logging.INFO, format="%(message)s")   # "building the CPU kernels into ..." (a minute)
status = load(retry=True)
print(status.note)
if "--every-width" in sys.argv[1:]:
    try:
        build_all()
    except RuntimeError as exc:
        print(f"the kernels for CPUs of the other vector width did not build: {exc}")
sys.exit(0 if status.loaded or not cpu_runs_them() or "PLAYGROUND_CPU_KERNELS=0" in status.note else 1)
