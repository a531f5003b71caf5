"""Batched sampling with per-request settings, per-token logprobs and lossless draft verification.

Sampling uses the inverse CDF with one uniform number per row: it costs a cumulative sum instead of a vocab-sized
random draw, and a seeded request draws its uniforms from (seed, position) alone, so its output does not depend
on what else shares the batch. The returned logprob of a token is taken under the temperature-scaled
distribution before top-p/top-k (what an RL trainer recomputes); under the raw distribution for greedy rows.

Verification of a deterministic draft (single path or tree) is the standard lossless rule: walk from the root,
accept a child token c with probability p'(c) where p' is the target distribution with the already rejected
siblings removed and renormalised; when every child is rejected, sample the bonus token from p'. Greedy rows
accept exactly the argmax, forced-replay rows exactly the recorded token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from seer.utils.fast_exp import fast_exp

TOPK_BLOCK = 64  # vocab slice whose maximum stands for it in ``top_k``


def top_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, dim=-1)`` of a 2-D ``x``: the values, descending, and their indices (equal values may come in
    another order). Why: a selection over the whole vocabulary is the dearest op of sampling a top-k/top-p row (about
    0.1 ms per row of 49k floats on a CPU, several percent of a sequence's share of a large decode step), and a
    verified draft pays it once per token.
    The ``k`` largest values lie in the ``k`` slices of ``TOPK_BLOCK`` whose maxima are largest (a slice holding
    one of them has its maximum at or above the ``k``-th value, and at most ``k`` slices hold one), so one pass
    for the slice maxima and a selection over those slices give the same values at about half the cost (k <= 50
    of 49k). Where ``k`` slices would be a quarter of the row, or the row is not whole slices, ``topk`` it is."""
    n, vocab = x.shape
    block = TOPK_BLOCK
    if vocab % block or 4 * k * block > vocab:
        return x.topk(k, dim=-1)
    slices = x.view(n, vocab // block, block)
    chosen = slices.amax(dim=-1).topk(k, dim=-1).indices
    values = slices.gather(1, chosen[:, :, None].expand(n, k, block)).view(n, k * block)
    top, pos = values.topk(k, dim=-1)
    return top, chosen.gather(1, pos // block) * block + pos % block


@dataclass(frozen=True)
class RowSpec:
    """Sampling settings of one logits row."""

    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    position: int = 0               # output index of the token this row produces (seeds the uniforms)
    forced: int | None = None       # forced-token replay: emit this token

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def filtered(self) -> bool:
        return not self.greedy and (self.top_p < 1.0 or self.top_k > 0)


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def uniform(self, row: RowSpec, salt: int = 0) -> float:
        if row.seed is None:
            return self.rng.random()
        return random.Random((row.seed * 1_000_003 + row.position) * 131 + salt).random()

    # ------------------------------------------------------------------ distributions
    @staticmethod
    def logprobs(logits: torch.Tensor, rows: list[RowSpec]) -> torch.Tensor:
        """log-softmax of temperature-scaled logits (raw for greedy rows), float32 [N, V]."""
        temps = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in rows],
                             dtype=torch.float32, device=logits.device)
        if bool((temps != 1.0).any()):
            logits = logits / temps[:, None]
        return torch.log_softmax(logits.float(), dim=-1)

    @staticmethod
    def probs(logprobs: torch.Tensor, rows: list[RowSpec]) -> torch.Tensor:
        """The distribution each row samples from: softmax, then top-k/top-p filtering, renormalised."""
        idx = [i for i, r in enumerate(rows) if r.filtered]
        if not idx:
            return fast_exp(logprobs)
        every = len(idx) == len(rows)
        sub = logprobs if every else logprobs[idx]
        kept, order = Sampler._nucleus(sub, [rows[i] for i in idx])
        filtered = torch.zeros_like(sub).scatter_(1, order, kept / kept.sum(dim=-1, keepdim=True))
        if every:  # only the kept tokens have mass: no vocab-wide exp
            return filtered
        probs = fast_exp(logprobs)
        probs[idx] = filtered
        return probs

    @staticmethod
    def _nucleus(logprobs: torch.Tensor, rows: list[RowSpec], floor: int = 256,
                 log_z: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, the top-k/top-p kept tokens: (probabilities, descending, zero past the cut; token ids).

        Works on the most probable few dozen or hundred tokens (a top-k) instead of sorting the vocabulary
        (49k-152k), which cost more than the rest of a decode step. A row filtered by top_p alone is covered
        once those candidates' mass reaches top_p (the first token outside has at least top_p before it);
        otherwise the candidates grow sixteenfold (a flat row at a high temperature) and, as the last resort, the
        whole vocabulary is sorted (a top-4096 costs a fifth of that sort on a 49k vocabulary). With ``log_z``,
        the rows are unnormalised log-probabilities (shifted logits) and ``log_z`` is their log-normaliser.
        """
        vocab = logprobs.shape[-1]
        p_only = [j for j, r in enumerate(rows) if r.top_k <= 0]
        width = min(vocab, max([r.top_k for r in rows] + ([floor] if p_only else [])))
        shift = 0.0 if log_z is None else log_z[:, None]
        while True:
            top, order = top_k(logprobs, width) if width < vocab else logprobs.sort(dim=-1, descending=True)
            values = fast_exp(top - shift)
            if width == vocab or not p_only:
                break
            mass = values[p_only].sum(dim=-1).tolist()
            if all(m >= rows[j].top_p for m, j in zip(mass, p_only)):
                break
            width = min(vocab, width * 16)
        keep = torch.ones_like(values, dtype=torch.bool)
        for j, r in enumerate(rows):
            if r.top_k > 0:
                keep[j, r.top_k:] = False
            if r.top_p < 1.0:
                keep[j] &= (values[j].cumsum(0) - values[j]) < r.top_p
        return values * keep, order

    def _draw(self, probs: torch.Tensor, uniforms: list[float]) -> torch.Tensor:
        cdf = probs.cumsum(dim=-1)
        u = torch.tensor(uniforms, dtype=cdf.dtype, device=cdf.device)[:, None] * cdf[:, -1:]
        tok = torch.searchsorted(cdf, u, right=True).squeeze(1)
        return tok.clamp_(max=probs.shape[-1] - 1)

    # ------------------------------------------------------------------ plain sampling
    def sample(self, logits: torch.Tensor, rows: list[RowSpec]) -> tuple[list[int], list[float]]:
        """One token per row, with its logprob. Float32 ``logits`` are overwritten (the caller's scratch).

        The hot path of every decode step (batch x vocab floats), so it makes one exp pass and no vocab-sized
        log-softmax: rows are shifted by their max in place, ``e = exp(x)`` gives both the normaliser and, for
        unfiltered rows, the blocked inverse CDF; a token's logprob is ``x[token] - log(sum(e))``.
        """
        x = self._scaled(logits, rows)
        x.sub_(x.amax(dim=-1, keepdim=True))
        e = fast_exp(x)
        log_z = e.sum(dim=-1).log()
        tokens = torch.zeros(len(rows), dtype=torch.long, device=x.device)
        greedy = [i for i, r in enumerate(rows) if r.greedy and r.forced is None]
        if greedy:
            tokens[greedy] = x[greedy].argmax(dim=-1)
        plain = [i for i, r in enumerate(rows) if not r.greedy and r.forced is None and not r.filtered]
        if plain:
            sub = e if len(plain) == len(rows) else e[plain]
            tokens[plain] = self._draw_blocked(sub, [self.uniform(rows[i]) for i in plain])
        filtered = [i for i, r in enumerate(rows) if r.filtered and r.forced is None]
        if filtered:
            sub = x if len(filtered) == len(rows) else x[filtered]
            kept, order = self._nucleus(sub, [rows[i] for i in filtered], log_z=log_z[filtered])
            pick = self._draw(kept, [self.uniform(rows[i]) for i in filtered])
            tokens[filtered] = order.gather(1, pick[:, None]).squeeze(1)
        for i, r in enumerate(rows):
            if r.forced is not None:
                tokens[i] = r.forced
        chosen = x.gather(1, tokens[:, None]).squeeze(1) - log_z
        return tokens.tolist(), chosen.tolist()

    @staticmethod
    def _scaled(logits: torch.Tensor, rows: list[RowSpec]) -> torch.Tensor:
        """Temperature-scaled float32 logits (raw for greedy rows); may be ``logits`` itself (see ``sample``)."""
        temps = [r.temperature if r.temperature > 0 else 1.0 for r in rows]
        if any(t != 1.0 for t in temps):
            return logits.float() / torch.tensor(temps, dtype=torch.float32, device=logits.device)[:, None]
        return logits.float()

    @staticmethod
    def _draw_blocked(weights: torch.Tensor, uniforms: list[float], block: int = 256) -> torch.Tensor:
        """Inverse CDF over unnormalised non-negative ``weights`` [N, V] in two levels (block sums, then one
        block): the token a full cumulative sum would pick (up to float rounding), at a fraction of its cost."""
        n, v = weights.shape
        nb = -(-v // block)
        if nb * block != v:
            weights = torch.nn.functional.pad(weights, (0, nb * block - v))
        blocks = weights.view(n, nb, block)
        bcdf = blocks.sum(dim=-1).cumsum(dim=-1)
        u = torch.tensor(uniforms, dtype=torch.float32, device=weights.device).clamp_(max=1.0 - 2.0 ** -24)
        target = (u * bcdf[:, -1])[:, None]
        b = torch.searchsorted(bcdf, target, right=True).clamp_(max=nb - 1)
        before = torch.where(b > 0, bcdf.gather(1, (b - 1).clamp(min=0)), torch.zeros_like(target))
        icdf = blocks[torch.arange(n, device=weights.device), b.squeeze(1)].cumsum(dim=-1)
        rest = torch.minimum(target - before, icdf[:, -1:] * (1.0 - 2.0 ** -20))
        j = torch.searchsorted(icdf, rest, right=True).clamp_(max=block - 1)
        return (b.squeeze(1) * block + j.squeeze(1)).clamp_(max=v - 1)

    # ------------------------------------------------------------------ verification
    def verify(self, logits: torch.Tensor, row: RowSpec, draft: list[int], parents: list[int] | None,
               forced: list[int] | None = None) -> tuple[list[int], list[float], list[int]]:
        """Verify one request's draft.

        ``logits`` has 1 + len(draft) rows: row 0 predicts after the last real token, row j+1 after draft token
        j. ``parents[j]`` is draft token j's parent (-1 = the last real token); None means a chain. ``forced``
        are the recorded next tokens (forced replay): a draft token is accepted iff it is the recorded token at
        its position, so none past the recording's end (the request ends there). Returns (emitted tokens, their
        logprobs, accepted draft indices along the path); the last emitted token is the bonus token.
        """
        rows = [row] * logits.shape[0]
        lp = self.logprobs(logits, rows)
        probs = None if (row.greedy or row.forced is not None or forced is not None) else self.probs(lp, rows)
        children: dict[int, list[int]] = {}
        for j in range(len(draft)):
            parent = (j - 1) if parents is None else parents[j]
            children.setdefault(parent, []).append(j)
        node, depth = -1, 0
        tokens: list[int] = []
        logps: list[float] = []
        path: list[int] = []
        while True:
            r = node + 1  # logits row of this node
            kids = children.get(node, []) if forced is None or depth < len(forced) else []
            nxt, tok = self._choose(lp[r], None if probs is None else probs[r], row, depth, draft, kids,
                                    None if forced is None else forced[depth] if depth < len(forced) else None)
            tokens.append(tok)
            logps.append(float(lp[r, tok]))
            if nxt is None:
                return tokens, logps, path
            path.append(nxt)
            node, depth = nxt, depth + 1

    def _choose(self, lp: torch.Tensor, probs: torch.Tensor | None, row: RowSpec, depth: int,
                draft: list[int], kids: list[int], forced_tok: int | None) -> tuple[int | None, int]:
        """Return (accepted child index or None, emitted token) at one node."""
        if forced_tok is not None or row.forced is not None or probs is None:
            target = forced_tok if forced_tok is not None else int(lp.argmax())
            for k in kids:
                if draft[k] == target:
                    return k, target
            return None, target
        pos_row = RowSpec(row.temperature, row.top_p, row.top_k, row.seed, row.position + depth)
        total = float(probs.sum()) if kids else 1.0
        rejected: dict[int, float] = {}  # rejected children's tokens and their mass: the residual leaves them out
        for salt, k in enumerate(kids, start=1):
            if total <= 0:
                break
            tok = draft[k]
            mass = 0.0 if tok in rejected else float(probs[tok])
            if self.uniform(pos_row, salt) < mass / total:
                return k, tok
            rejected[tok] = mass
            total -= mass
        p = probs
        if any(rejected.values()):
            p = probs.clone()
            p[list(rejected)] = 0.0
            if float(p.sum()) <= 0:  # every token with mass was a rejected draft: cannot happen with exact arithmetic
                p = probs
        return None, int(self._draw(p[None], [self.uniform(pos_row, 0)])[0])
