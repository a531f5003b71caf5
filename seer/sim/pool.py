"""The simulated global KV pool: which paused requests' KV lives in the pool, and how many bytes moved.

Why not ``seer.rollout.kv_pool``: that pool stores real KV payloads (host memory, disk spill). The simulator
moves no tensors, only accounting: tokens covered per request, so a resumed chunk knows how much KV it gets back,
and bytes in and out, which the cost model turns into transfer time and the report into ``kv_bytes_moved``.
"""

from __future__ import annotations


class SimKVPool:
    def __init__(self) -> None:
        self.entries: dict[int, int] = {}   # request id -> KV tokens held (simulated tokens)
        self.bytes_put = 0
        self.bytes_get = 0
        self.puts = 0
        self.gets = 0

    def put(self, request_id: int, tokens: int, nbytes: int) -> None:
        if tokens < 0 or nbytes < 0:
            raise ValueError(f"request {request_id}: negative KV ({tokens} tokens, {nbytes} bytes)")
        self.entries[request_id] = tokens
        self.bytes_put += nbytes
        self.puts += 1

    def pop(self, request_id: int) -> int:
        """Tokens of KV the pool held for the request (0 if it holds none: the request recomputes)."""
        return self.entries.pop(request_id, 0)

    def record_get(self, nbytes: int) -> None:
        self.bytes_get += nbytes
        self.gets += 1

    def clear(self) -> int:
        """Drop every entry (a rollout ended: what is left is garbage); returns how many there were."""
        n = len(self.entries)
        self.entries.clear()
        return n

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def kv_bytes_moved(self) -> int:
        return self.bytes_put + self.bytes_get

    def check_integrity(self) -> None:
        assert all(t >= 0 for t in self.entries.values()), "negative KV tokens in the pool"
        assert self.bytes_put >= 0 and self.bytes_get >= 0 and self.gets <= self.puts, "pool counters corrupt"
