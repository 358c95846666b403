"""Our own CPU kernels (the .cpp files here), built once and loaded as torch ops (`torch.ops.playground`).

They are compiled with the C++ compiler on first use, against the PyTorch installed, into the
playground's cache (one folder per source and PyTorch version), and loaded from there after that.
Where they cannot run (a CPU without AVX2 and FMA, no compiler, a failed build, or
PLAYGROUND_CPU_KERNELS=0) the model runs on PyTorch's own kernels, and `status()` says why.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = sorted(Path(__file__).parent.glob("*.cpp"))
HEADERS = sorted(Path(__file__).parent.glob("*.h"))
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-std=c++20", "-shared", "-fPIC", "-w"]
BUILD_TIMEOUT_S = 300
ROWS_KERNEL_MAX = 64  # rows_linear.h's kRowsKernelMax: the most rows of x its kernels take


@dataclass(frozen=True)
class KernelStatus:
    loaded: bool
    note: str  # the library loaded, or why the kernels do not run here


def _cpu_runs_them() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _library_path() -> Path:
    from playground.model.target import cache_root

    digest = hashlib.sha256(" ".join(FLAGS + [torch.__version__]).encode())
    for source in SOURCES + HEADERS:
        digest.update(source.read_bytes())
    return cache_root() / "kernels" / digest.hexdigest()[:16] / "playground_kernels.so"


def _run(commands: list[list[str]]) -> None:
    """Run the commands at once (a source each: both cores compile); the first failure as an error."""
    running = [subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for command in commands]
    failures = []
    for process in running:
        _, stderr = process.communicate(timeout=BUILD_TIMEOUT_S)
        if process.returncode != 0:
            failures.append((stderr.strip().splitlines() or [f"exit status {process.returncode}"])[-1])
    if failures:
        raise RuntimeError(f"the build failed: {failures[0]}")


def _build(library: Path) -> None:
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler ({compiler})")
    torch_lib = cpp_extension.library_paths()[0]
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
        objects = [Path(tmp) / f"{source.stem}.o" for source in SOURCES]
        _run([[compiler, *FLAGS, "-c", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               *(f"-I{path}" for path in cpp_extension.include_paths()), str(source), "-o", str(obj)]
              for source, obj in zip(SOURCES, objects)])
        built = Path(tmp) / library.name
        _run([[compiler, *FLAGS, *map(str, objects), "-o", str(built), f"-L{torch_lib}", "-lc10", "-ltorch_cpu",
               f"-Wl,-rpath,{torch_lib}"]])
        built.replace(library)  # atomic: processes building at once each put a whole library there


@functools.cache
def status() -> KernelStatus:
    """Build (first time) and load the kernels; what happened, in one line."""
    if os.environ.get("PLAYGROUND_CPU_KERNELS", "1") == "0":
        return KernelStatus(False, "PyTorch's kernels (PLAYGROUND_CPU_KERNELS=0)")
    if not _cpu_runs_them():
        return KernelStatus(False, "PyTorch's kernels (this CPU has no AVX2)")
    library = _library_path()
    try:
        if not library.exists():
            log.info("building the CPU kernels into %s", library.parent)
            _build(library)
        torch.ops.load_library(str(library))
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        log.warning("the playground's CPU kernels do not run here (%s): PyTorch's kernels instead", exc)
        return KernelStatus(False, f"PyTorch's kernels (ours: {exc})")
    return KernelStatus(True, f"the playground's AVX2 kernels ({library})")
