"""The machine a measurement ran on, recorded in every benchmark report.

Why: CPUs differ in what decides engine speed. A CPU with AVX512_BF16 or AMX computes bf16 natively and runs it
1.5-2.5x faster than fp32; one with AVX-512 but neither runs bf16 about 2.6x slower than fp32; an AVX2-only CPU
cannot pack bf16 weights at all. A figure without its CPU, core count, dtype and torch version cannot be compared
with another. Torch-free (the torch version is read from the installed package's metadata, not by importing it).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from functools import lru_cache
from pathlib import Path

# the instruction-set features that change which kernels and dtype are fastest
FEATURES = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
            "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "bf16")


@lru_cache(maxsize=1)
def cpu_info() -> dict:
    """Model name, the FEATURES it has, logical CPUs present and usable by this process, architecture."""
    fields = _proc_cpuinfo()
    flags = set(fields.get("flags", fields.get("Features", "")).split())
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": fields.get("model name") or platform.processor() or platform.machine(),
            "arch": platform.machine(), "features": [f for f in FEATURES if f in flags],
            "cpus": os.cpu_count(), "usable_cpus": usable}


def native_bf16() -> bool:
    """Whether this CPU computes bf16 dot products in hardware (AVX512_BF16 or AMX on x86, BF16 on Arm)."""
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & set(cpu_info()["features"]))


def auto_dtype(device: str = "cpu") -> str:
    """The faster engine dtype here: bf16 on an accelerator or a CPU that computes it natively, else fp32 (a CPU
    without native bf16 emulates it, and fp32 is then the faster of the two)."""
    return "bfloat16" if device.startswith("cuda") or native_bf16() else "float32"


def _installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(dtype: str | None = None) -> dict:
    """``cpu_info`` plus the Python and torch versions and, if given, the dtype the run used."""
    torch = sys.modules.get("torch")
    info = {"cpu": cpu_info(), "python": platform.python_version(),
            "torch": getattr(torch, "__version__", None) or _installed("torch")}
    if dtype is not None:
        info["dtype"] = dtype
    return info


def _proc_cpuinfo() -> dict[str, str]:
    """The first processor's ``key: value`` lines (Linux); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip(), value.strip())
    return out
