"""Build, load and call the C paged-attention kernel (``paged_attn.c``) for short queries on CPU.

Why a C kernel at all: see the header of ``paged_attn.c`` (decode attention in pure PyTorch is gather-bound).
Why ctypes rather than a torch C++ extension: the kernel needs only raw pointers, so it compiles with plain gcc
in about a second (a torch extension needs the torch headers, ~1 minute on two cores) and has no ABI tie to
the torch build. It links ``-fopenmp``; since torch has already loaded its ``libgomp.so.1``, the dynamic
linker binds the kernel to that same OpenMP runtime, so both share one thread pool.

The shared object is cached under ``$SEER_CACHE/kernels`` (default ``~/.cache/seer/kernels``), keyed by a
hash of the source, the compiler flags and the CPU model. ``SEER_ATTN_KERNEL=0`` disables the kernel; any build
or load failure disables it too (logged once) and the PyTorch path is used.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("paged_attn.c")
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def _cpu_signature() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    root = os.environ.get("SEER_CACHE") or str(Path.home() / ".cache" / "seer")
    return Path(root) / "kernels"


def _build(source_path: Path, target: Path) -> None:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        proc = subprocess.run([compiler, *_FLAGS, f"-I{source_path.parent}", str(source_path), "-o", str(out), "-lm"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {source_path.name} failed:\n{proc.stderr[-2000:]}")
        os.replace(out, target)  # atomic: concurrent builders never see a half-written library


def build_library(source_path: Path) -> ctypes.CDLL:
    """Compile (or reuse from the cache) the C file ``source_path`` and load it. Raises on any failure.

    Also used by ``seer.models.rms_norm``: one build machinery (flags, cache, CPU key) for every C kernel.
    """
    key = hashlib.sha256("\0".join([source_digest(source_path), *_FLAGS, _cpu_signature()]).encode()).hexdigest()
    target = _cache_dir() / f"{source_path.stem}-{key[:16]}.so"
    if not target.is_file():
        _build(source_path, target)
    return ctypes.CDLL(str(target))


def source_digest(source_path: Path = _SOURCE) -> str:
    """Hash of a kernel's C file and the headers beside it (what its build depends on); by default the
    attention kernel's, which the verify-cost profiler keys its cache with."""
    parts = [source_path, *sorted(source_path.parent.glob("*.h"))]
    return hashlib.sha256(b"\0".join(p.read_bytes() for p in parts)).hexdigest()[:16]


def _load() -> ctypes.CDLL:
    lib = build_library(_SOURCE)
    fn = lib.seer_paged_attention
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, p, p, p, p, i64, p, p, p, p, i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int,
                   ctypes.c_int]
    fn.restype = ctypes.c_int
    return lib


def kernel_available() -> bool:
    """True when the compiled kernel is loaded (builds it on the first call)."""
    global _lib, _tried
    if _tried:
        return _lib is not None
    with _lock:
        if not _tried:
            if os.environ.get("SEER_ATTN_KERNEL", "1") == "0":
                log.info("paged attention kernel disabled by SEER_ATTN_KERNEL=0")
            else:
                try:
                    _lib = _load()
                except Exception as e:  # noqa: BLE001 - any failure means: use the PyTorch path
                    log.warning("paged attention C kernel unavailable, using the PyTorch path: %s", e)
                    _lib = None
            _tried = True
    return _lib is not None


def kernel_supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16) and k_cache.dtype == q.dtype
            and kernel_available())


def run_kernel(q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               block_tables: torch.Tensor, q_start: torch.Tensor, q_len: torch.Tensor, seq_len: torch.Tensor,
               allowed: torch.Tensor | None, scale: float) -> None:
    """Attention of the sequences described by the int64 vectors into ``out`` (same shape as ``q`` [T, H, D]).

    ``allowed[t]`` (int64 bitmask, optional) lists the new tokens of t's sequence that token t may see.
    All tensors must be contiguous CPU tensors; int tensors int64.
    """
    assert _lib is not None, "kernel_available() must be checked first"
    T, H, D = q.shape
    num_blocks, block_size, hkv, d2 = k_cache.shape
    if d2 != D or H % hkv:
        raise ValueError(f"kernel shape mismatch: q {tuple(q.shape)} vs cache {tuple(k_cache.shape)}")
    for name, t in (("q", q), ("out", out), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("block_tables", block_tables)):
        if not t.is_contiguous():
            raise ValueError(f"kernel input {name} must be contiguous")
    rc = _lib.seer_paged_attention(
        q.data_ptr(), out.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
        block_tables.shape[1], q_start.data_ptr(), q_len.data_ptr(), seq_len.data_ptr(),
        allowed.data_ptr() if allowed is not None else None, q_len.shape[0], H, hkv, D, block_size,
        float(scale), int(q.dtype == torch.bfloat16), torch.get_num_threads())
    if rc != 0:
        raise MemoryError("paged attention kernel could not allocate its work buffers")
