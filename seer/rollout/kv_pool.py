"""The global KV pool: where a paused request's KV cache waits between chunks of divided rollout.

Why: divided rollout moves a request's next chunk to whichever instance has room; if its KV had to be
recomputed there, moving would cost a re-prefill of the whole context (ruinous at 100k-token responses). So at
the end of a chunk the instance writes the request's KV here and any instance can read it back. The paper backs
this with Mooncake over RDMA; here it is host memory with a byte budget, spilling the least recently used
entries to files beyond it and reading them back byte-exact.

`KVPool` is the abstract interface (a process-shared backend, e.g. shared memory or the Ray object store, can
implement it later); `LocalKVPool` is the in-process one, guarded by a lock because instances may call from
threads. Payloads are bytes, memoryviews or numpy arrays (any dtype/shape: `get` returns an array of the same
dtype and shape) and are copied on `put`. Every byte written to or read from the pool is counted:
`bytes_put + bytes_get` is the pool's contribution to the `kv_bytes_moved` metric.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

Payload = bytes | bytearray | memoryview | np.ndarray
PoolT = TypeVar("PoolT", bound="KVPool")


class KVPoolFullError(MemoryError):
    """The pool has no spill directory and the payload does not fit its memory budget."""


@dataclass(frozen=True)
class PoolStats:
    """Counters since the pool was created (bytes are payload bytes)."""

    entries: int
    bytes_in_memory: int
    bytes_on_disk: int
    bytes_put: int
    bytes_get: int
    spilled_bytes: int  # written to disk, in total
    loaded_bytes: int  # read back from disk, in total

    @property
    def kv_bytes_moved(self) -> int:
        return self.bytes_put + self.bytes_get


class KVPool(ABC):
    """Interface of a KV pool keyed by request id."""

    @abstractmethod
    def put(self, request_id: Hashable, payload: Payload, meta: dict[str, Any] | None = None) -> None:
        """Store (a copy of) the payload, replacing any entry for this request."""

    @abstractmethod
    def get(self, request_id: Hashable) -> tuple[Payload, dict[str, Any]]:
        """Return (payload, meta); the entry stays. Raises KeyError if absent."""

    def pop(self, request_id: Hashable) -> tuple[Payload, dict[str, Any]]:
        """`get` then `drop`."""
        out = self.get(request_id)
        self.drop(request_id)
        return out

    @abstractmethod
    def drop(self, request_id: Hashable) -> bool:
        """Forget an entry (its file too); returns whether it existed."""

    @abstractmethod
    def contains(self, request_id: Hashable) -> bool: ...

    def __contains__(self, request_id: Hashable) -> bool:
        return self.contains(request_id)

    @abstractmethod
    def stats(self) -> PoolStats: ...

    @abstractmethod
    def check_integrity(self) -> None: ...

    @abstractmethod
    def clear(self) -> int:
        """Drop every entry (a new rollout starts: request ids restart, so an entry left by an earlier rollout
        would pass for a new request's KV); returns how many there were."""

    @abstractmethod
    def close(self) -> None:
        """Drop everything and remove spill files."""

    def __enter__(self: PoolT) -> PoolT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Entry:
    meta: dict[str, Any]
    nbytes: int
    dtype: np.dtype | None  # None: the payload was bytes-like
    shape: tuple[int, ...]
    data: bytes | None = None  # in memory
    path: str | None = None  # spilled


def _to_bytes(payload: Payload) -> tuple[bytes, np.dtype | None, tuple[int, ...]]:
    if isinstance(payload, np.ndarray):
        return np.ascontiguousarray(payload).tobytes(), payload.dtype, tuple(payload.shape)
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload), None, ()
    raise TypeError(f"KV payload must be bytes, memoryview or a numpy array, not {type(payload).__name__}")


def _from_bytes(data: bytes, entry: _Entry) -> Payload:
    if entry.dtype is None:
        return data
    return np.frombuffer(data, dtype=entry.dtype).reshape(entry.shape).copy()


class LocalKVPool(KVPool):
    """Host-memory pool with an LRU byte budget; beyond it, entries spill to files in `spill_dir`."""

    def __init__(self, budget_bytes: int, spill_dir: str | os.PathLike[str] | None = None) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._dir = tempfile.mkdtemp(prefix="seer-kv-", dir=os.fspath(spill_dir)) if spill_dir is not None else None
        self._lock = threading.RLock()
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()  # least recently used first
        self._file_seq = 0
        self._in_memory = self._on_disk = 0
        self._put = self._got = self._spilled = self._loaded = 0

    @property
    def spill_dir(self) -> str | None:
        return self._dir

    def put(self, request_id: Hashable, payload: Payload, meta: dict[str, Any] | None = None) -> None:
        data, dtype, shape = _to_bytes(payload)
        with self._lock:
            if self._dir is None:
                old = self._entries.get(request_id)
                held = self._in_memory - (old.nbytes if old is not None else 0)
                if held + len(data) > self.budget_bytes:
                    raise KVPoolFullError(f"KV pool budget {self.budget_bytes} B exceeded and no spill directory")
            self._drop_locked(request_id)
            entry = _Entry(dict(meta or {}), len(data), dtype, shape)
            self._entries[request_id] = entry
            self._put += entry.nbytes
            self._hold(request_id, entry, data)

    def get(self, request_id: Hashable) -> tuple[Payload, dict[str, Any]]:
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None:
                raise KeyError(f"request {request_id!r} has no KV in the pool")
            self._entries.move_to_end(request_id)
            if entry.data is not None:
                data = entry.data
            else:
                data = self._load(entry)
                self._hold(request_id, entry, data)
            self._got += entry.nbytes
            return _from_bytes(data, entry), dict(entry.meta)

    def pop(self, request_id: Hashable) -> tuple[Payload, dict[str, Any]]:
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None:
                raise KeyError(f"request {request_id!r} has no KV in the pool")
            data = entry.data if entry.data is not None else self._load(entry)
            self._got += entry.nbytes
            self._drop_locked(request_id)
            return _from_bytes(data, entry), dict(entry.meta)

    def drop(self, request_id: Hashable) -> bool:
        with self._lock:
            return self._drop_locked(request_id)

    def contains(self, request_id: Hashable) -> bool:
        with self._lock:
            return request_id in self._entries

    def stats(self) -> PoolStats:
        with self._lock:
            return PoolStats(
                len(self._entries), self._in_memory, self._on_disk,
                self._put, self._got, self._spilled, self._loaded,
            )

    def close(self) -> None:
        with self._lock:
            for rid in list(self._entries):
                self._drop_locked(rid)
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)

    def clear(self) -> int:
        with self._lock:
            stale = list(self._entries)
            for rid in stale:
                self._drop_locked(rid)
            return len(stale)

    def check_integrity(self) -> None:
        """Byte tallies match the entries, memory is within budget, every spilled file exists and is whole."""
        with self._lock:
            mem = sum(e.nbytes for e in self._entries.values() if e.data is not None)
            disk = sum(e.nbytes for e in self._entries.values() if e.path is not None)
            assert (mem, disk) == (self._in_memory, self._on_disk), "KV pool byte tallies are off"
            assert self._in_memory <= self.budget_bytes, "KV pool exceeds its memory budget"
            for rid, e in self._entries.items():
                assert (e.data is None) != (e.path is None), f"entry {rid!r} must be in memory xor on disk"
                assert e.data is None or len(e.data) == e.nbytes, f"entry {rid!r} size"
                assert e.path is None or os.path.getsize(e.path) == e.nbytes, f"entry {rid!r} file size"
            if self._dir is not None:
                files = {e.path for e in self._entries.values() if e.path is not None}
                on_disk = {os.path.join(self._dir, f) for f in os.listdir(self._dir)}
                assert files == on_disk, "KV pool spill directory holds stray or missing files"

    # ---- internals (lock held) --------------------------------------------------------------------------
    def _hold(self, request_id: Hashable, entry: _Entry, data: bytes) -> None:
        """Keep `entry` in memory if it can fit, spilling older entries; else it lives on disk."""
        if entry.nbytes > self.budget_bytes:
            if entry.path is None:
                self._spill(entry, data)
            return
        self._make_room(entry.nbytes, keep=request_id)
        if entry.path is not None:
            self._remove_file(entry)
        entry.data = data
        self._in_memory += entry.nbytes

    def _make_room(self, nbytes: int, keep: Hashable) -> None:
        for rid, other in self._entries.items():
            if self._in_memory + nbytes <= self.budget_bytes:
                return
            if rid != keep and other.data is not None:
                self._spill(other, other.data)
        if self._in_memory + nbytes > self.budget_bytes:
            raise KVPoolFullError(f"KV pool budget {self.budget_bytes} B exceeded and no spill directory")

    def _spill(self, entry: _Entry, data: bytes) -> None:
        if self._dir is None:
            raise KVPoolFullError(f"KV pool budget {self.budget_bytes} B exceeded and no spill directory")
        self._file_seq += 1
        path = os.path.join(self._dir, f"{self._file_seq:09d}.kv")
        with open(path, "wb") as f:
            f.write(data)
        if entry.data is not None:
            self._in_memory -= entry.nbytes
            entry.data = None
        entry.path = path
        self._on_disk += entry.nbytes
        self._spilled += entry.nbytes

    def _load(self, entry: _Entry) -> bytes:
        assert entry.path is not None
        with open(entry.path, "rb") as f:
            data = f.read()
        if len(data) != entry.nbytes:
            raise OSError(f"KV spill file {entry.path} is {len(data)} B, expected {entry.nbytes} B")
        self._loaded += entry.nbytes
        return data

    def _remove_file(self, entry: _Entry) -> None:
        assert entry.path is not None
        os.remove(entry.path)
        entry.path = None
        self._on_disk -= entry.nbytes

    def _drop_locked(self, request_id: Hashable) -> bool:
        entry = self._entries.pop(request_id, None)
        if entry is None:
            return False
        if entry.data is not None:
            self._in_memory -= entry.nbytes
        if entry.path is not None:
            self._remove_file(entry)
        return True
