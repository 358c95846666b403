"""The host a measurement ran on, as every report names it: runs on different hosts differ most in
the CPU's model and in whether it computes bf16 natively."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import torch

from playground.engines.cpu_share import CONFIGURED_THREADS


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_model() -> str:
    line = next((line for line in _cpuinfo().splitlines() if line.startswith("model name")), "")
    return line.partition(":")[2].strip() or platform.processor() or platform.machine()


def cpu_label(host: dict) -> str:
    """The CPU's model as a sentence names it: without trademark marks and the words "CPU" and "Processor"
    ("Intel(R) Xeon(R) Processor" -> "Intel Xeon"); reports keep the model as the CPU gives it."""
    name = re.sub(r"\((R|TM)\)|\b(CPU|Processor)\b", "", host.get("cpu", host["processor"]), flags=re.IGNORECASE)
    return " ".join(name.split())


def native_bf16() -> bool:
    """Whether the CPU computes bf16 natively (AVX512-BF16 or AMX); elsewhere oneDNN emulates it."""
    flags = _cpuinfo()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def machine() -> dict:
    return {"processor": platform.processor() or platform.machine(), "cpu": cpu_model(),
            "native_bf16": native_bf16(), "torch": torch.__version__,
            "threads": CONFIGURED_THREADS}


def described(host: dict) -> str:
    """A report's line for the host (a `machine()` dict, also one read back from a saved report)."""
    return (f"{host.get('cpu', host['processor'])}{', native bf16' if host.get('native_bf16') else ''}, "
            f"{host['threads']} threads, torch {host['torch']}")
