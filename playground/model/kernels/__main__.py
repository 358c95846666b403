"""`python -m playground.model.kernels`: build the CPU kernels now (again, after a failed build) and
say what runs here. Exits 1 when they should run on this CPU but do not."""

import logging
import sys

from playground.model.kernels import cpu_runs_them, load

logging.basicConfig(level=logging.INFO, format="%(message)s")   # "building the CPU kernels into ..." (a minute)
status = load(retry=True)
print(status.note)
sys.exit(0 if status.loaded or not cpu_runs_them() or "PLAYGROUND_CPU_KERNELS=0" in status.note else 1)
