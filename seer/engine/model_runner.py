"""Runs one scheduled step on the model: builds the flat batch, runs the forward pass, samples or verifies.

The paged KV cache lives here (one K and one V tensor per layer, ``[num_blocks, block_size, kv_heads,
head_dim]``); the scheduler only knows block ids. Tree drafts are laid out in consecutive slots with depth-based
positions; after verification the KV of the accepted path is copied down to consecutive positions so the cache
again looks as if the accepted tokens had been decoded one by one.
"""

from __future__ import annotations

import torch

from seer.engine.request import Request
from seer.engine.sampler import RowSpec, Sampler
from seer.engine.scheduler import ScheduledChunk, SchedulerOutput, StepResult
from seer.models.attention import AttentionMetadata
from seer.utils.kv_size import kv_bytes_per_token


class ModelRunner:
    def __init__(self, model: torch.nn.Module, num_layers: int, num_kv_heads: int, head_dim: int,
                 num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str,
                 seed: int = 0) -> None:
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=self.device),
                           torch.zeros(shape, dtype=dtype, device=self.device)) for _ in range(num_layers)]
        self.sampler = Sampler(seed)
        self.forward_tokens = 0

    @property
    def kv_bytes_per_token(self) -> int:
        k, _ = self.kv_caches[0]
        return kv_bytes_per_token(len(self.kv_caches), k.shape[2], k.shape[3], k.element_size())

    # ------------------------------------------------------------------ batch building
    def _slot(self, req: Request, pos: int) -> int:
        return req.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size

    def _build(self, out: SchedulerOutput, reqs: dict[str, Request]):
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        q_lens: list[int] = []
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        parents_all: list[list[int] | None] = []
        any_tree = False
        for c in out.chunks:
            req = reqs[c.request_id]
            n_real = c.num_new_tokens - c.num_spec_tokens
            toks = [req.token_at(p) for p in range(c.start, c.start + n_real)]
            pos = list(range(c.start, c.start + n_real))
            spec = req.spec_token_ids[:c.num_spec_tokens]
            parents = None
            if spec:
                if req.spec_parents is not None:
                    parents = self._tree_parents(req.spec_parents[:len(spec)], n_real)
                    any_tree = True
                depth = self._depths(req.spec_parents, len(spec))
                last = req.num_tokens - 1
                pos += [last + d for d in depth]
                toks += spec
            ids += toks
            positions += pos
            slots += [self._slot(req, p) for p in range(c.start, c.start + c.num_new_tokens)]
            q_lens.append(c.num_new_tokens)
            seq_lens.append(c.start + c.num_new_tokens)
            tables.append(req.block_ids)
            parents_all.append(parents)
        width = max(len(t) for t in tables)
        table = torch.zeros((len(tables), width), dtype=torch.int64)
        for i, t in enumerate(tables):
            table[i, :len(t)] = torch.tensor(t, dtype=torch.int64)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
            query_lens=q_lens, seq_lens=seq_lens, block_tables=table.to(self.device),
            block_size=self.block_size, tree_parents=parents_all if any_tree else None)
        return (torch.tensor(ids, dtype=torch.int64, device=self.device),
                torch.tensor(positions, dtype=torch.int64, device=self.device), meta)

    @staticmethod
    def _depths(parents: list[int] | None, n: int) -> list[int]:
        if parents is None:
            return list(range(1, n + 1))
        depth: list[int] = []
        for j in range(n):
            p = parents[j]
            depth.append(1 if p < 0 else depth[p] + 1)
        return depth

    @staticmethod
    def _tree_parents(spec_parents: list[int], n_real: int) -> list[int]:
        """Parents within the chunk's new tokens: real tokens form a chain; drafts hang off the last real one."""
        chain = list(range(-1, n_real - 1))
        return chain + [(n_real - 1) if p < 0 else n_real + p for p in spec_parents]

    # ------------------------------------------------------------------ execution
    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, reqs: dict[str, Request]) -> dict[str, StepResult]:
        if out.is_empty:
            return {}
        input_ids, positions, meta = self._build(out, reqs)
        hidden = self.model(input_ids, positions, meta, self.kv_caches)
        self.forward_tokens += int(input_ids.shape[0])
        rows_idx: list[int] = []
        offset = 0
        for c in out.chunks:
            if c.samples:
                first = offset + c.num_new_tokens - c.num_spec_tokens - 1
                rows_idx += range(first, offset + c.num_new_tokens)
            offset += c.num_new_tokens
        if not rows_idx:
            return {}
        logits = self.model.compute_logits(hidden[torch.tensor(rows_idx, device=hidden.device)])  # type: ignore[operator]
        return self._results(out, reqs, logits)

    def _row_spec(self, req: Request) -> RowSpec:
        p = req.params
        pos = req.num_output_tokens
        forced = req.forced_token_ids[pos] if req.forced_token_ids is not None and pos < len(req.forced_token_ids) \
            else None
        return RowSpec(p.temperature, p.top_p, p.top_k, p.seed, pos, forced)

    def _results(self, out: SchedulerOutput, reqs: dict[str, Request], logits: torch.Tensor) -> dict[str, StepResult]:
        results: dict[str, StepResult] = {}
        plain = [c for c in out.chunks if c.samples and not c.num_spec_tokens]
        row = 0
        plain_rows: list[int] = []
        spec_rows: list[tuple[ScheduledChunk, int]] = []
        for c in out.chunks:
            if not c.samples:
                continue
            if c.num_spec_tokens:
                spec_rows.append((c, row))
                row += c.num_spec_tokens + 1
            else:
                plain_rows.append(row)
                row += 1
        if plain:
            specs = [self._row_spec(reqs[c.request_id]) for c in plain]
            rows = logits if len(plain_rows) == logits.shape[0] else logits[plain_rows]  # no copy when all plain
            toks, lps = self.sampler.sample(rows, specs)
            for c, t, lp in zip(plain, toks, lps):
                results[c.request_id] = StepResult([t], [lp], 0)
        for c, r0 in spec_rows:
            results[c.request_id] = self._verify(c, reqs[c.request_id], logits[r0:r0 + c.num_spec_tokens + 1])
        return results

    def _verify(self, c, req: Request, logits: torch.Tensor) -> StepResult:
        spec = req.spec_token_ids[:c.num_spec_tokens]
        parents = None if req.spec_parents is None else req.spec_parents[:len(spec)]
        row = self._row_spec(req)
        forced = None
        if req.forced_token_ids is not None:
            forced = req.forced_token_ids[req.num_output_tokens:req.num_output_tokens + len(spec) + 1]
            row = RowSpec(row.temperature, row.top_p, row.top_k, row.seed, row.position, None)
        tokens, logps, path = self.sampler.verify(logits, row, spec, parents, forced)
        if parents is not None and path:
            self._compact(req, c.start + c.num_new_tokens - c.num_spec_tokens, path)
        return StepResult(tokens, logps, len(path))

    def _compact(self, req: Request, first_draft_pos: int, path: list[int]) -> None:
        """Copy the accepted tree path's KV to consecutive positions after the last real token."""
        src = [self._slot(req, first_draft_pos + j) for j in path]
        dst = [self._slot(req, first_draft_pos + d) for d in range(len(path))]
        if src == dst:
            return
        s = torch.tensor(src, device=self.device)
        d = torch.tensor(dst, device=self.device)
        for k, v in self.kv_caches:
            kf, vf = k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])
            kf[d] = kf[s]
            vf[d] = vf[s]

    # ------------------------------------------------------------------ KV export / import
    def read_kv(self, req: Request, num_tokens: int) -> torch.Tensor:
        """KV of positions [0, num_tokens): [layers, 2, num_tokens, kv_heads, head_dim]."""
        slots = torch.tensor([self._slot(req, p) for p in range(num_tokens)], device=self.device)
        layers = []
        for k, v in self.kv_caches:
            kf, vf = k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])
            layers.append(torch.stack([kf[slots], vf[slots]]))
        return torch.stack(layers)

    def write_kv(self, req: Request, kv: torch.Tensor, start: int = 0) -> None:
        """Write ``kv`` ([layers, 2, tokens, kv_heads, head_dim]) at positions ``start`` onwards."""
        num_tokens = kv.shape[2]
        if num_tokens == 0:
            return
        slots = torch.tensor([self._slot(req, p) for p in range(start, start + num_tokens)], device=self.device)
        kv = kv.to(self.device, dtype=self.kv_caches[0][0].dtype)
        for layer, (k, v) in enumerate(self.kv_caches):
            k.view(-1, *k.shape[2:])[slots] = kv[layer, 0]
            v.view(-1, *v.shape[2:])[slots] = kv[layer, 1]
