"""Paged KV cache accounting: fixed-size blocks, refcounts and prefix sharing by hashing full blocks.

The G responses of a GRPO group share their prompt, so the prompt's full blocks are computed once and then
referenced by every sibling. A full block is identified by a chain key (parent key hash, its tokens), so equal
keys mean equal token prefixes. Freed blocks keep their key and stay reusable until their space is needed
(least recently freed are evicted first). Torch-free: the simulator uses the same accounting.
"""

from __future__ import annotations

from collections import OrderedDict

from seer.engine.request import Request

BlockKey = tuple[int, tuple[int, ...]]


class BlockManager:
    """Owns ``num_blocks`` blocks of ``block_size`` token slots each."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be > 0, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_key: list[BlockKey | None] = [None] * num_blocks
        self.key_to_block: dict[BlockKey, int] = {}
        # Blocks with refcount 0, least recently freed first; cached ones are evicted lazily from the front.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.prefix_hit_tokens = 0

    # ------------------------------------------------------------------ queries
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def chain_keys(self, token_ids: list[int], num_full_blocks: int, start: int = 0,
                   parent: BlockKey | None = None) -> list[BlockKey]:
        """Keys of full blocks ``start .. num_full_blocks-1`` of ``token_ids``."""
        keys: list[BlockKey] = []
        bs = self.block_size
        parent_hash = hash(parent) if parent is not None else 0
        for b in range(start, num_full_blocks):
            key = (parent_hash, tuple(token_ids[b * bs:(b + 1) * bs]))
            keys.append(key)
            parent_hash = hash(key)
        return keys

    def prompt_keys(self, req: Request) -> list[BlockKey]:
        """Keys of the full blocks of a request's tokens, excluding the block holding the last token.

        The last token must always be computed (its logits give the next token), so a fully cached prompt
        still recomputes its last block.
        """
        if not self.enable_prefix_caching:
            return []
        return self.chain_keys(req.all_token_ids(), (req.num_tokens - 1) // self.block_size)

    def find_cached_prefix(self, keys: list[BlockKey]) -> list[int]:
        hits: list[int] = []
        for key in keys:
            block = self.key_to_block.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    # ------------------------------------------------------------------ allocation
    def allocate_cached_prefix(self, req: Request) -> int:
        """Attach the longest cached prefix to a request that holds no blocks; returns tokens covered."""
        assert not req.block_ids and req.num_computed_tokens == 0
        hits = self.find_cached_prefix(self.prompt_keys(req))
        for block in hits:
            self._ref(block)
        req.block_ids = list(hits)
        req.num_hashed_blocks = len(hits)
        req.num_computed_tokens = len(hits) * self.block_size
        self.prefix_hit_tokens += req.num_computed_tokens
        return req.num_computed_tokens

    def detach_cached_prefix(self, req: Request) -> None:
        """Give back the blocks of a request that was not admitted after ``allocate_cached_prefix``, and uncount
        the hit it counted (``num_computed_tokens``, which nothing has advanced since): the next try attaches and
        counts the prefix again."""
        self.prefix_hit_tokens -= req.num_computed_tokens
        self.free(req)
        req.num_computed_tokens = 0

    def num_blocks_to_allocate(self, req: Request, num_new_tokens: int) -> int:
        need = self.blocks_needed(req.num_computed_tokens + num_new_tokens)
        return max(0, need - len(req.block_ids))

    def can_allocate(self, req: Request, num_new_tokens: int) -> bool:
        return self.num_blocks_to_allocate(req, num_new_tokens) <= self.num_free_blocks

    def allocate(self, req: Request, num_new_tokens: int) -> bool:
        """Give ``req`` enough blocks to hold ``num_computed_tokens + num_new_tokens`` tokens."""
        n = self.num_blocks_to_allocate(req, num_new_tokens)
        if n > self.num_free_blocks:
            return False
        for _ in range(n):
            block, _ = self.free_queue.popitem(last=False)
            self._evict_key(block)
            self.ref_counts[block] = 1
            req.block_ids.append(block)
        return True

    def free(self, req: Request) -> None:
        """Release a request's blocks (reverse order, so a sequence's tail is evicted before its prefix)."""
        for block in reversed(req.block_ids):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue[block] = None
        req.block_ids = []
        req.num_hashed_blocks = 0

    def trim(self, req: Request, num_tokens: int) -> None:
        """Drop blocks beyond what ``num_tokens`` tokens need (rejected speculative slots)."""
        keep = self.blocks_needed(num_tokens)
        while len(req.block_ids) > keep:
            block = req.block_ids.pop()
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue[block] = None
        req.num_hashed_blocks = min(req.num_hashed_blocks, len(req.block_ids))

    def cache_full_blocks(self, req: Request) -> None:
        """Register the keys of blocks that became full of computed tokens, so later requests share them."""
        if not self.enable_prefix_caching:
            return
        num_full = min(req.num_computed_tokens, req.num_tokens) // self.block_size
        if num_full <= req.num_hashed_blocks:
            return
        tokens = req.all_token_ids()
        parent = self.block_key[req.block_ids[req.num_hashed_blocks - 1]] if req.num_hashed_blocks else None
        if req.num_hashed_blocks and parent is None:
            # The parent block was not registered (a duplicate of another block): recompute the chain.
            keys = self.chain_keys(tokens, num_full)[req.num_hashed_blocks:]
        else:
            keys = self.chain_keys(tokens, num_full, req.num_hashed_blocks, parent)
        for i, key in enumerate(keys, start=req.num_hashed_blocks):
            block = req.block_ids[i]
            if self.block_key[block] is None and key not in self.key_to_block:
                self.block_key[block] = key
                self.key_to_block[key] = block
        req.num_hashed_blocks = num_full

    def reset_prefix_cache(self) -> None:
        """Forget every cached key (new weights make old KV invalid)."""
        for block, key in enumerate(self.block_key):
            if key is not None:
                self.block_key[block] = None
        self.key_to_block.clear()

    # ------------------------------------------------------------------ internals
    def _ref(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self.free_queue[block]
        self.ref_counts[block] += 1

    def _evict_key(self, block: int) -> None:
        key = self.block_key[block]
        if key is not None:
            self.block_key[block] = None
            if self.key_to_block.get(key) == block:
                del self.key_to_block[key]

    def check_integrity(self, requests: list[Request] | None = None) -> None:
        """Refcounts match the requests' block tables; free queue = blocks with refcount 0; keys consistent."""
        for b in range(self.num_blocks):
            assert self.ref_counts[b] >= 0, f"block {b} has negative refcount"
            assert (self.ref_counts[b] == 0) == (b in self.free_queue), f"block {b} free-queue mismatch"
        for key, block in self.key_to_block.items():
            assert self.block_key[block] == key, f"block {block} key mismatch"
        if requests is not None:
            counts = [0] * self.num_blocks
            for req in requests:
                assert len(set(req.block_ids)) == len(req.block_ids), f"{req.request_id} repeats a block"
                for block in req.block_ids:
                    counts[block] += 1
                assert len(req.block_ids) * self.block_size >= req.num_computed_tokens, \
                    f"{req.request_id} has fewer slots than computed tokens"
            assert counts == self.ref_counts, "refcounts differ from the requests' block tables"
