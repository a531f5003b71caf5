"""Global KV pool: byte-exact round trips, LRU spill to disk and back, counters, errors, threads, cleanup."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from seer.rollout.file_pool import FileKVPool
from seer.rollout.kv_pool import KVPool, KVPoolFullError, LocalKVPool


def payload(seed: int, n: int = 60) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def spill_files(pool: LocalKVPool) -> int:
    assert pool.spill_dir is not None
    return len(os.listdir(pool.spill_dir))


def test_round_trip_bytes_memoryview_and_arrays(tmp_path: Path) -> None:
    with LocalKVPool(1 << 20, tmp_path) as pool:
        assert isinstance(pool, KVPool)
        data = bytearray(payload(1))
        pool.put(1, memoryview(data), {"tokens": 7})
        data[0] ^= 0xFF  # the pool copied it
        got, meta = pool.get(1)
        assert got == payload(1) and meta == {"tokens": 7}
        layers = np.random.default_rng(2).standard_normal((2, 3, 5)).astype(np.float16)
        pool.put("r2", layers)
        arr, _ = pool.get("r2")
        assert isinstance(arr, np.ndarray) and arr.dtype == np.float16 and arr.shape == (2, 3, 5)
        assert arr.tobytes() == layers.tobytes()
        assert pool.contains(1) and "r2" in pool and not pool.contains(3)
        pool.check_integrity()


def test_spills_lru_beyond_budget_and_reads_back_byte_exact(tmp_path: Path) -> None:
    pool = LocalKVPool(130, tmp_path)
    for i in range(3):
        pool.put(i, payload(i))
    s = pool.stats()  # 180 B into 130: the oldest (0) went to disk
    assert (s.entries, s.bytes_in_memory, s.bytes_on_disk, s.spilled_bytes) == (3, 120, 60, 60)
    assert spill_files(pool) == 1
    pool.check_integrity()
    got, _ = pool.get(0)  # back byte-exact; promoting it spills the LRU in memory (1)
    assert got == payload(0)
    s = pool.stats()
    assert (s.bytes_in_memory, s.bytes_on_disk, s.loaded_bytes, s.spilled_bytes) == (120, 60, 60, 120)
    pool.get(2)  # touch 2: now 0 and 2 are recent, 1 is on disk
    pool.put(3, payload(3))  # spills 0 (least recently used in memory), not 2
    assert pool.get(2)[0] == payload(2) and pool.stats().bytes_on_disk == 120
    for i in range(4):
        assert pool.get(i)[0] == payload(i)
    pool.check_integrity()
    pool.close()
    assert not os.path.exists(str(pool.spill_dir))


def test_entry_larger_than_budget_lives_on_disk(tmp_path: Path) -> None:
    pool = LocalKVPool(10, tmp_path)
    pool.put("big", payload(5, 100))
    assert pool.get("big")[0] == payload(5, 100)
    s = pool.stats()
    assert (s.bytes_in_memory, s.bytes_on_disk, s.bytes_get) == (0, 100, 100)
    pool.check_integrity()
    pool.close()


def test_counters_pop_and_drop_clean_files(tmp_path: Path) -> None:
    pool = LocalKVPool(70, tmp_path)
    pool.put("a", payload(1))
    pool.put("b", payload(2))  # spills a
    pool.put("b", payload(3))  # replace: old b forgotten
    assert pool.pop("a")[0] == payload(1)
    s = pool.stats()
    assert (s.bytes_put, s.bytes_get, s.kv_bytes_moved, s.entries) == (180, 60, 240, 1)
    assert spill_files(pool) == 0
    assert pool.drop("b") and not pool.drop("b")
    with pytest.raises(KeyError):
        pool.get("b")
    with pytest.raises(KeyError):
        pool.pop("b")
    pool.check_integrity()
    pool.close()


def test_without_spill_dir_the_budget_is_hard() -> None:
    pool = LocalKVPool(100)
    pool.put(1, payload(1))
    with pytest.raises(KVPoolFullError):
        pool.put(2, payload(2))
    pool.put(1, payload(3))  # replacing within budget is fine
    assert pool.get(1)[0] == payload(3) and pool.stats().entries == 1
    pool.check_integrity()
    with pytest.raises(TypeError):
        pool.put(3, [1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LocalKVPool(-1)


def test_concurrent_use_from_threads(tmp_path: Path) -> None:
    pool = LocalKVPool(1000, tmp_path)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(40):
                key = (t, i % 7)
                pool.put(key, payload(t * 100 + i, 50))
                assert pool.get(key)[0] == payload(t * 100 + i, 50)
                if i % 3 == 0:
                    pool.drop(key)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    pool.check_integrity()
    pool.close()
    assert pool.stats().entries == 0


@pytest.mark.parametrize("kind", ["local", "file"])
def test_clear_drops_every_entry_in_memory_and_on_disk(tmp_path: Path, kind: str) -> None:
    if kind == "local":
        pool: LocalKVPool | FileKVPool = LocalKVPool(budget_bytes=100, spill_dir=tmp_path)
    else:
        pool = FileKVPool(tmp_path / "mem", tmp_path / "disk", budget_bytes=100)
    for rid in range(3):  # 60 B each: the second and third spill
        pool.put(rid, payload(rid), {"tokens": rid})
    assert pool.stats().entries == 3 and pool.stats().bytes_on_disk > 0
    assert pool.clear() == 3
    assert pool.stats().entries == 0 and not any(pool.contains(r) for r in range(3))
    pool.check_integrity()
    pool.put(0, payload(9))  # still usable
    assert bytes(pool.get(0)[0]) == payload(9)
    pool.close()


def test_file_pool_put_survives_an_entry_popped_by_another_process(tmp_path: Path, monkeypatch) -> None:
    """Other processes pop entries without the put lock: one listed by the budget check and gone before it is
    measured no longer counts, instead of failing the eviction that was putting KV."""
    pool = FileKVPool(tmp_path / "mem", tmp_path / "disk", budget_bytes=1000)
    pool.put(1, payload(1))
    pool.put(2, payload(2))
    other = FileKVPool(tmp_path / "mem", tmp_path / "disk", budget_bytes=1000)  # the same pool, elsewhere
    scandir = os.scandir

    def listed_then_popped(directory):
        entries = list(scandir(directory))
        other.drop(1)
        return iter(entries)

    monkeypatch.setattr(os, "scandir", listed_then_popped)
    pool.put(3, payload(3))
    monkeypatch.undo()
    assert not pool.contains(1) and pool.pop(3)[0].tobytes() == payload(3)
    pool.check_integrity()
