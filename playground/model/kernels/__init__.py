"""Our own CPU kernels (the .cpp files here), built once and loaded as torch ops (`torch.ops.playground`).

They are compiled with the C++ compiler against the PyTorch installed, into the playground's cache
(a folder per source and PyTorch version, a library per compiler), and loaded from there after
that: by `python -m playground.model.kernels` (scripts/setup.sh runs it; the Space image runs it with
--every-width, so that an image built on one CPU runs on another), or else on first use. Each
source is built twice over: with AVX-512's 16-float vectors, loaded where PyTorch finds AVX-512, and
with AVX2's 8, loaded elsewhere (or where PLAYGROUND_CPU_VECTORS=avx2 asks for them). A failed build
is recorded beside the library, and only that command tries again. Where they cannot run (a CPU without AVX2 and FMA, no compiler, a failed build, or
PLAYGROUND_CPU_KERNELS=0) the model runs on PyTorch's own kernels, and `status()` says why. Which
kernels a model runs is chosen once, when it loads (`Target.load(kernels=...)`).
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

from playground.settings import cache_root

log = logging.getLogger(__name__)

SOURCES = sorted(Path(__file__).parent.glob("*.cpp"))
HEADERS = sorted(Path(__file__).parent.glob("*.h"))
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-std=c++20", "-shared", "-fPIC", "-w"]
# the vector widths the kernels are built for: the flags each adds (rows_linear.cpp reads __AVX512F__)
VECTOR_FLAGS = {"avx512": ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"], "avx2": []}
VECTORS_ENV = "PLAYGROUND_CPU_VECTORS"
BUILD_TIMEOUT_S = 300
ROWS_KERNEL_MAX = 64  # rows_linear.h's kRowsKernelMax: the most rows of x its kernels take


@dataclass(frozen=True)
class KernelStatus:
    loaded: bool
    note: str  # the library loaded, or why the kernels do not run here


def cpu_runs_them() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def vectors() -> str:
    """The build this CPU loads: avx512 where PyTorch finds AVX-512 (and PLAYGROUND_CPU_VECTORS does not
    ask for avx2), else avx2."""
    widest = "avx512" if torch.backends.cpu.get_cpu_capability() == "AVX512" else "avx2"
    return "avx2" if os.environ.get(VECTORS_ENV, widest) == "avx2" else widest


def _compiler() -> tuple[str, str | None]:
    """The C++ compiler ($CXX, else g++) and the first line of its --version (None: there is none)."""
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        return compiler, None
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return compiler, None
    return compiler, (done.stdout.strip().splitlines() or [f"{compiler} (no version)"])[0]


def _flags(width: str) -> list[str]:
    return FLAGS + VECTOR_FLAGS[width]


def _folder(width: str) -> Path:
    """Where the kernels of these sources, flags and PyTorch are kept: a library per compiler."""

    digest = hashlib.sha256(" ".join(_flags(width) + [torch.__version__]).encode())
    for source in SOURCES + HEADERS:
        digest.update(source.read_bytes())
    return cache_root() / "kernels" / digest.hexdigest()[:16]


def _built_by(version: str) -> str:
    return hashlib.sha256(version.encode()).hexdigest()[:12]


def library_path(version: str, width: str) -> Path:
    """The library the compiler of this --version line builds (another compiler builds its own)."""
    return _folder(width) / f"playground_kernels-{_built_by(version)}.so"


def _failure_path(version: str, width: str) -> Path:
    return _folder(width) / f"failed-{_built_by(version)}.txt"


def _run(commands: list[list[str]], timeout_s: float = BUILD_TIMEOUT_S) -> None:
    """Run the commands at once (a source each: both cores compile); the first failure as an error.
    Whatever goes wrong (a failure, the timeout, an interrupt), no compiler is left running."""
    running = [subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for command in commands]
    try:
        failures = []
        for process in running:
            _, stderr = process.communicate(timeout=timeout_s)
            if process.returncode != 0:
                failures.append((stderr.strip().splitlines() or [f"exit status {process.returncode}"])[-1])
        if failures:
            raise RuntimeError(f"the build failed: {failures[0]}")
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the build took longer than {timeout_s:.0f} s") from None
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()
                process.wait()


def _build(library: Path, compiler: str, flags: list[str]) -> None:
    from torch.utils import cpp_extension

    torch_lib = cpp_extension.library_paths()[0]
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
        objects = [Path(tmp) / f"{source.stem}.o" for source in SOURCES]
        _run([[compiler, *flags, "-c", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               *(f"-I{path}" for path in cpp_extension.include_paths()), str(source), "-o", str(obj)]
              for source, obj in zip(SOURCES, objects)])
        built = Path(tmp) / library.name
        # the rpath makes the library's libgomp.so.1 PyTorch's own: one OpenMP runtime in the process
        _run([[compiler, *flags, *map(str, objects), "-o", str(built), f"-L{torch_lib}", "-lc10", "-ltorch_cpu",
               f"-Wl,-rpath,{torch_lib}"]])
        built.replace(library)  # atomic: processes building at once each put a whole library there


def _library(retry: bool, width: str) -> Path:
    """The library to load: this compiler's, built if missing. A failed build is recorded, so that
    no later process pays for it again unless `retry`. Without a compiler, one built before (an
    image whose compiler was removed after the build)."""
    compiler, version = _compiler()
    if version is None:
        built = sorted(_folder(width).glob("playground_kernels-*.so"), key=lambda p: p.stat().st_mtime)
        if not built:
            raise RuntimeError(f"no C++ compiler ({compiler})")
        return built[-1]
    library, failure = library_path(version, width), _failure_path(version, width)
    if library.exists():
        return library
    if failure.exists() and not retry:
        raise RuntimeError(f"{failure.read_text().strip()} (an earlier build; `python -m playground.model.kernels` "
                           "builds again)")
    log.info("building the CPU kernels (%s) into %s", width, library.parent)
    try:
        _build(library, compiler, _flags(width))
    except RuntimeError as exc:
        failure.parent.mkdir(parents=True, exist_ok=True)
        failure.write_text(str(exc))
        raise
    failure.unlink(missing_ok=True)
    return library


def build_all() -> None:
    """Build every vector width this compiler lacks (an image's build host need not be the CPU it runs on)."""
    for width in VECTOR_FLAGS:
        if width != vectors():
            _library(retry=True, width=width)


def load(retry: bool = False) -> KernelStatus:
    """Build (where needed) and load the kernels; what happened, in one line."""
    if os.environ.get("PLAYGROUND_CPU_KERNELS", "1") == "0":
        return KernelStatus(False, "PyTorch's kernels (PLAYGROUND_CPU_KERNELS=0)")
    if not cpu_runs_them():
        return KernelStatus(False, "PyTorch's kernels (this CPU has no AVX2)")
    width = vectors()
    try:
        library = _library(retry, width)
        torch.ops.load_library(str(library))
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        log.warning("the playground's CPU kernels do not run here (%s): PyTorch's kernels instead", exc)
        return KernelStatus(False, f"PyTorch's kernels (ours: {exc})")
    return KernelStatus(True, f"the playground's {'AVX-512' if width == 'avx512' else 'AVX2'} kernels ({library})")


@functools.cache
def status() -> KernelStatus:
    """The kernels of this process, loaded on first use (`load`), once."""
    return load()
