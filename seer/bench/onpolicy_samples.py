"""The samples of the end-to-end on-policy checks, and what is compared between them.

Why: whether Seer's rollout samples the policy can only be judged against plain sampling of the same prompt with
the same settings, feature by feature. The arms are drawn here: plain ``seer.LLM`` sampling (the reference),
the same engine with grouped speculative decoding (drafts from sibling responses, verified instead of sampled),
and a divided ``RolloutCoordinator`` rollout over several in-process instances with small chunks and no KV
affinity, so nearly every response is paused after each chunk and resumed on another instance from KV parked in
the global pool. Each arm also returns the evidence that its mechanism ran (drafted and accepted tokens,
responses that changed instance, KV imported from the pool): a check whose mechanism did not run proves nothing.
Shared with tests/rollout/test_onpolicy.py, which runs the same comparisons on a tiny random model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seer.sampling_params import SamplingParams
from seer.utils.stats import ChiSquare, homogeneity

if TYPE_CHECKING:
    from seer.llm import LLM

ENDED = -1  # "no token at this position": the response stopped before it


@dataclasses.dataclass(frozen=True)
class Response:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    group: int
    instances: tuple[int, ...] = ()  # rollouts: the instance of each chunk


def group_params(params: SamplingParams, n: int, group: int) -> list[SamplingParams]:
    """One ``SamplingParams`` per group of ``group`` siblings (n // group groups); a seeded ``params`` gives group
    g the seed ``seed + g`` (groups sharing a seed would repeat each other)."""
    return [dataclasses.replace(params, n=group, seed=None if params.seed is None else params.seed + g)
            for g in range(n // group)]


def llm_sample(llm: "LLM", prompt: Sequence[int], params: SamplingParams, n: int, group: int,
               max_num_seqs: int = 256, progress: bool = False) -> tuple[list[Response], dict[str, int]]:
    """``n`` responses to ``prompt`` from a ``seer.LLM`` (with whatever speculator it has), at most
    ``max_num_seqs`` at once, and the engine's drafting counters of this call."""
    sched = llm.engine.scheduler
    sched.config = dataclasses.replace(sched.config, max_num_seqs=max_num_seqs)
    per_group = group_params(params, n, group)
    before = llm.engine.stats
    b = (before.spec_drafted, before.spec_accepted, before.spec_steps)
    outs = llm.generate([list(prompt)] * len(per_group), per_group, use_tqdm=progress)
    st = llm.engine.stats
    counters = dict(drafted=st.spec_drafted - b[0], accepted=st.spec_accepted - b[1], steps=st.spec_steps - b[2])
    return [Response(tuple(c.token_ids), tuple(c.logprobs), g) for g, out in enumerate(outs)
            for c in out.outputs], counters


def rollout_sample(model: Path, prompt: Sequence[int], params: SamplingParams, n: int, group: int,
                   instances: int, chunk_tokens: int, max_batch: int = 32, seed: int = 5,
                   progress: bool = False) -> tuple[list[Response], dict[str, Any]]:
    """``n`` responses from a divided rollout on ``instances`` in-process instances, ``chunk_tokens`` per chunk,
    KV for about ``max_batch`` requests per instance and no KV affinity (each next chunk goes wherever dispatch
    puts it, its KV through the pool); with the evidence that requests moved and KV came from the pool."""
    from seer.engine.config import EngineConfig
    from seer.engine.speculator import SpecConfig
    from seer.rollout.config import RolloutConfig
    from seer.rollout.coordinator import RolloutCoordinator
    from seer.rollout.types import GroupInput

    block = 4
    blocks = max_batch * -(-(len(prompt) + params.max_tokens) // block) + 8
    cfg = RolloutConfig(policy="divided", instances=instances, chunk_tokens=chunk_tokens, kv_affinity_spread=0,
                        engine=EngineConfig(dtype="float32", block_size=block, num_kv_blocks=blocks, seed=seed),
                        spec=SpecConfig(adaptive=False, gamma_max=4))  # not adaptive: no cost profiling
    groups = [GroupInput(tuple(prompt), group, params, key=f"onpolicy-{g}") for g in range(n // group)]
    with RolloutCoordinator(model, cfg) as coord:
        out = coord.rollout(groups, progress=progress)
    res = out.result
    sample = [Response(tuple(r.token_ids), tuple(r.logprobs), r.group_id, tuple(r.instance_history))
              for r in res.responses]
    evidence = {"responses_changed_instance": sum(len(set(r.instances)) > 1 for r in sample),
                "kv_imports_from_pool": int(sum(out.onpolicy.get("kv_imports_by_version", {}).values())),
                "kv_bytes_loaded_per_instance": {str(i): int(st.get("kv_bytes_loaded", 0))
                                                 for i, st in res.stats["instances"].items()},
                "kv_bytes_moved": int(res.metrics.kv_bytes_moved),
                "reprefill_tokens": int(res.metrics.reprefill_tokens)}
    return sample, evidence


def features(sample: Sequence[Response], max_tokens: int) -> dict[str, list[Hashable]]:
    """What is compared: the token at each position (ENDED once stopped), the length, the first two tokens."""
    out: dict[str, list[Hashable]] = {
        f"token{k + 1}": [r.tokens[k] if len(r.tokens) > k else ENDED for r in sample] for k in range(max_tokens)}
    out["length"] = [len(r.tokens) for r in sample]
    out["tokens1-2"] = [r.tokens[:2] for r in sample]
    return out


def compare(arm: Sequence[Response], reference: Sequence[Response], max_tokens: int) -> dict[str, ChiSquare]:
    """Feature -> two-sample homogeneity test of ``arm`` against ``reference``."""
    fa, fr = features(arm, max_tokens), features(reference, max_tokens)
    return {name: homogeneity(fa[name], fr[name]) for name in fa}


def cross_instance_pairs(sample: Sequence[Response]) -> list[tuple[Response, Response]]:
    """Disjoint pairs of siblings whose first tokens were sampled on different instances: per group, repeatedly
    one sibling from each of the two instances with the most unpaired siblings."""
    pairs: list[tuple[Response, Response]] = []
    by_group: dict[int, dict[int, list[Response]]] = {}
    for r in sample:
        by_group.setdefault(r.group, {}).setdefault(r.instances[0], []).append(r)
    for buckets in by_group.values():
        while True:
            full = sorted((b for b in buckets.values() if b), key=len, reverse=True)
            if len(full) < 2:
                break
            pairs.append((full[0].pop(), full[1].pop()))
    return pairs


def sibling_pairs(sample: Sequence[Response]) -> list[tuple[Response, Response]]:
    """Disjoint pairs of siblings: (0, 1), (2, 3), ... of each group (independent pairs if siblings are)."""
    by_group: dict[int, list[Response]] = {}
    for r in sample:
        by_group.setdefault(r.group, []).append(r)
    return [(g[i], g[i + 1]) for g in by_group.values() for i in range(0, len(g) - 1, 2)]


def agreement(pairs: Sequence[tuple[Response, Response]], k: int | None) -> list[bool]:
    """Per pair, whether the two responses agree on their first ``k`` tokens (None: entirely)."""
    return [a.tokens[:k] == b.tokens[:k] for a, b in pairs]
