"""A KV pool shared between processes: one file per entry, in host memory (``/dev/shm``) up to a byte budget
and in a spill directory on disk beyond it.

Instances in separate processes move a paused request's KV through it: the instance that evicts writes the
file, the one that resumes the request reads and deletes it. Files are written under a temporary name and
renamed, so a reader never sees half an entry. The budget is checked against the memory tier's current size
on every put (a scan of one directory) under an exclusive lock on the pool, so processes putting at once cannot
all see room that only one of them has.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np

from seer.rollout.kv_pool import KVPool, Payload, PoolStats


class FileKVPool(KVPool):
    def __init__(self, memory_dir: str | Path, spill_dir: str | Path, budget_bytes: int) -> None:
        self.memory_dir = Path(memory_dir)
        self.spill_dir = Path(spill_dir)
        self.budget_bytes = budget_bytes
        for d in (self.memory_dir, self.spill_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.counters = {"bytes_put": 0, "bytes_get": 0, "spilled_bytes": 0, "loaded_bytes": 0}

    @classmethod
    def create(cls, budget_bytes: int, spill_root: str | None = None) -> "FileKVPool":
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        mem = tempfile.mkdtemp(prefix="seer-kv-", dir=shm)
        spill = tempfile.mkdtemp(prefix="seer-kv-spill-", dir=spill_root)
        return cls(mem, spill, budget_bytes)

    def _paths(self, rid: Hashable) -> list[Path]:
        return [self.memory_dir / f"{rid}.kv", self.spill_dir / f"{rid}.kv"]

    def _memory_bytes(self) -> int:
        return _kv_bytes(self.memory_dir)

    def put(self, request_id: Hashable, payload: Payload, meta: dict[str, Any] | None = None) -> None:
        data = payload.tobytes() if isinstance(payload, np.ndarray) else bytes(payload)
        with open(self.memory_dir / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            self.drop(request_id)
            to_disk = self._memory_bytes() + len(data) > self.budget_bytes
            target = self._paths(request_id)[1 if to_disk else 0]
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(data)
            target.with_suffix(".json").write_text(json.dumps(meta or {}))
            os.replace(tmp, target)
        self.counters["bytes_put"] += len(data)
        if to_disk:
            self.counters["spilled_bytes"] += len(data)

    def get(self, request_id: Hashable) -> tuple[Payload, dict[str, Any]]:
        for i, path in enumerate(self._paths(request_id)):
            if path.exists():
                data = path.read_bytes()
                meta = json.loads(path.with_suffix(".json").read_text())
                self.counters["bytes_get"] += len(data)
                if i == 1:
                    self.counters["loaded_bytes"] += len(data)
                return np.frombuffer(data, dtype=np.uint8), meta
        raise KeyError(f"request {request_id!r} has no KV in the pool")

    def pop(self, request_id: Hashable) -> tuple[Payload, dict[str, Any]]:
        out = self.get(request_id)
        self.drop(request_id)
        return out

    def drop(self, request_id: Hashable) -> bool:
        found = False
        for path in self._paths(request_id):
            for p in (path, path.with_suffix(".json")):
                if p.exists():
                    p.unlink()
                    found = True
        return found

    def clear(self) -> int:
        stale = [Path(e.path) for d in (self.memory_dir, self.spill_dir) for e in os.scandir(d)
                 if e.name.endswith((".kv", ".tmp"))]  # .tmp: a writer killed mid-put
        for path in stale:
            path.unlink(missing_ok=True)
            path.with_suffix(".json").unlink(missing_ok=True)
        return sum(p.suffix == ".kv" for p in stale)

    def contains(self, request_id: Hashable) -> bool:
        return any(p.exists() for p in self._paths(request_id))

    def stats(self) -> PoolStats:
        mem = self._memory_bytes()
        disk = _kv_bytes(self.spill_dir)
        entries = sum(1 for d in (self.memory_dir, self.spill_dir) for e in os.scandir(d) if e.name.endswith(".kv"))
        c = self.counters
        return PoolStats(entries, mem, disk, c["bytes_put"], c["bytes_get"], c["spilled_bytes"], c["loaded_bytes"])

    def check_integrity(self) -> None:
        for d in (self.memory_dir, self.spill_dir):
            for e in os.scandir(d):
                if e.name.endswith(".kv"):
                    assert Path(e.path).with_suffix(".json").exists(), f"{e.path} has no metadata"

    def close(self) -> None:
        shutil.rmtree(self.memory_dir, ignore_errors=True)
        shutil.rmtree(self.spill_dir, ignore_errors=True)


def _kv_bytes(directory: Path) -> int:
    """Bytes of the entries in ``directory``. Other processes pop and drop entries without the put lock, so a
    file listed a moment ago may be gone when it is measured: it no longer counts."""
    total = 0
    for e in os.scandir(directory):
        if e.name.endswith(".kv"):
            try:
                total += e.stat().st_size
            except FileNotFoundError:
                continue
    return total
