"""Check 1 of ``seer bench onpolicy``: draft verification against the user's model's real next-token distributions.

Why: the verifier must emit each token with exactly the probability plain sampling would, under the user's
temperature and top-p/top-k. tests/engine/test_verify_statistics.py checks that on random 64-token logits; a real
model's rows differ in ways that matter (49k-152k tokens, a long tail the filters cut, a few dominant tokens), so
here the rows are the model's own logits, over its whole vocabulary: after a prompt, and after two continuations
of it (its most likely token, its second most likely). From each root two drafts are verified ``n`` times: a
chain of the most likely tokens (mostly accepted), drawing from the sampler's own stream, and a tree whose root
branches are the second most likely token, the least likely kept token and a token the filters drop (never to be
emitted), so that most steps reject and draw the bonus token from the residual, with per-trial request seeds (the
seeded-uniform path rollouts use). Every logits row of a draft is the model's logits after that node's path. The
first emitted token is compared with the row's filtered target (``Sampler.probs``, what plain sampling draws
from) by a Pearson goodness-of-fit test on at most ``MAX_BINS`` pooled bins. Verification runs on one torch
thread: each call is a few vocabulary-wide operations on a handful of rows, where a second thread only adds
synchronisation (several times slower on a busy 2-core machine). About 3-7 ms per call on a 49k vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from seer.engine import sampler as sampler_mod
from seer.engine.sampler import RowSpec
from seer.utils.stats import detectable_tv, goodness_of_fit

MAX_BINS = 40  # pools per test: keeps the stated power whatever the model's tail


@dataclass(frozen=True)
class Draft:
    name: str
    tokens: tuple[int, ...]
    parents: tuple[int, ...]  # parent of each draft token, -1 = the root
    seeded: bool

    @property
    def chain(self) -> bool:
        return self.parents == tuple(range(-1, len(self.tokens) - 1))


def next_logits(model: Any, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
    """Float32 next-token logits [len(contexts), V] of ``model`` (the engine's own) after each context."""
    rows = []
    with torch.inference_mode():
        for ctx in contexts:
            ids = torch.tensor([list(ctx)], dtype=torch.long, device=model.device)
            rows.append(model.compute_logits(model.forward_dense(ids)[0, -1:]).float().cpu())
    return torch.cat(rows)


def target(logits: torch.Tensor, row: RowSpec) -> torch.Tensor:
    """The filtered distribution each row samples from under ``row``'s settings, float64 [rows, V]."""
    rows = [row] * logits.shape[0]
    return sampler_mod.Sampler.probs(sampler_mod.Sampler.logprobs(logits.clone(), rows), rows).double()


def ranked(p: torch.Tensor) -> tuple[list[int], list[int]]:
    """(kept tokens, most probable first; the most probable dropped token, if any) of one filtered row."""
    order = p.argsort(descending=True, stable=True).tolist()
    count = int((p > 0).sum())
    return order[:count], order[count:count + 1]


def drafts(root: torch.Tensor, next_top: int) -> list[Draft]:
    """The two drafts from a root with filtered row ``root``; ``next_top`` continues the first branch."""
    kept, dropped = ranked(root)
    tail = kept[-1]
    second = kept[1] if len(kept) > 1 else kept[0]
    outside = dropped[0] if dropped else kept[len(kept) // 2]
    return [Draft("chain-likely", (kept[0], next_top), (-1, 0), seeded=False),
            Draft("tree-mixed", (second, tail, outside, next_top), (-1, -1, -1, 0), seeded=True)]


def node_contexts(root: Sequence[int], draft: Draft) -> list[list[int]]:
    """Context of every logits row of ``draft``: the root's, then each draft token's path."""
    paths: list[list[int]] = []
    for tok, parent in zip(draft.tokens, draft.parents):
        paths.append((paths[parent] if parent >= 0 else []) + [tok])
    return [list(root)] + [list(root) + p for p in paths]


def verify_case(model: Any, root: Sequence[int], draft: Draft, row: RowSpec, n: int, seed: int) -> dict[str, Any]:
    """Verify ``draft`` ``n`` times after ``root``; the first token's goodness of fit and the acceptance counts."""
    logits = next_logits(model, node_contexts(root, draft))
    probs = target(logits[:1], row)[0]
    sampler = sampler_mod.Sampler(seed=seed)
    counts = [0] * logits.shape[1]
    accepted = from_draft = 0
    parents = None if draft.chain else list(draft.parents)
    for trial in range(n):
        r = RowSpec(row.temperature, row.top_p, row.top_k, seed=seed * 100_003 + trial if draft.seeded else None)
        tokens, _, path = sampler.verify(logits, r, list(draft.tokens), parents)
        counts[tokens[0]] += 1
        accepted += len(path)
        from_draft += bool(path)
    test = goodness_of_fit(counts, probs.tolist(), max_bins=MAX_BINS)
    return {"root_tokens": len(root), "draft": draft.name, "draft_tokens": list(draft.tokens),
            "seeded": draft.seeded, "kept_tokens": int((probs > 0).sum()), "n": n, **test.as_dict(),
            "bins": test.bins, "detectable_tv": round(detectable_tv(n, test.bins), 4),
            "drafted": n * len(draft.tokens), "accepted": accepted, "first_token_from_draft": from_draft,
            "first_token_from_residual": n - from_draft}


def verify_check(model: Any, prompt: Sequence[int], row: RowSpec, n: int, seed: int, progress: bool = True
                 ) -> tuple[list[dict[str, Any]], bool, dict[str, int]]:
    """Check 1: every root x draft case; (the cases' tests, whether both halves of the rule ran, i.e. a draft
    token accepted and a first token drawn from the residual after rejections, and the counts that say so)."""
    probs0 = target(next_logits(model, [prompt]), row)[0]
    kept0, _ = ranked(probs0)
    roots = [list(prompt), list(prompt) + [kept0[0]]] + ([list(prompt) + [kept0[1]]] if len(kept0) > 1 else [])
    cases: list[dict[str, Any]] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tqdm(total=2 * len(roots), desc="verify", unit="case", disable=not progress) as bar:
            for i, root in enumerate(roots):
                probs = target(next_logits(model, [root]), row)[0]
                first = int(probs.argmax())
                next_top = int(target(next_logits(model, [root + [first]]), row)[0].argmax())
                for d in drafts(probs, next_top):
                    cases.append({"root": i, **verify_case(model, root, d, row, n, seed + len(cases))})
                    bar.update()
    finally:
        torch.set_num_threads(threads)
    evidence = {key: sum(c[key] for c in cases) for key in
                ("drafted", "accepted", "first_token_from_draft", "first_token_from_residual")}
    evidence["verifications"] = n * len(cases)
    return cases, evidence["first_token_from_draft"] > 0 and evidence["first_token_from_residual"] > 0, evidence
