"""Simulator workloads: the paper's three presets (Table 3 shapes) and any trace file in the shared formats.

Why both: presets reproduce the paper's scale (hundreds of GPUs, responses up to 98k tokens) where no trace of
that size is public; traces carry real lengths (and, for token-id traces, real text for the suffix trees).
A ``Workload`` is groups of response lengths (plus token ids when known) and the cluster the preset ran on;
``to_groups(quantum)`` turns it into the driver's ``GroupInput``s at a token quantum (see ``sim_instance.py``):
responses become forced tokens, real ones at quantum 1 with token ids, otherwise one dummy token id per response
(unique, so prefix caching never shares blocks between different responses) repeated to the recorded length.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from seer.data.traces import generation_limit, load_trace, sample_groups
from seer.rollout.types import GroupInput
from seer.sampling_params import SamplingParams
from seer.sim.hardware import InstanceSpec, get_accelerator, get_model
from seer.sim.lengths import LengthModel

PROMPT_TOKEN_BASE = 1 << 24
RESPONSE_TOKEN_BASE = 1 << 30


@dataclass(frozen=True)
class PaperTargets:
    """The paper's measured veRL rollout and Seer's improvement (arXiv 2511.14617, Table 3 workloads)."""

    verl_total_s: float
    verl_tail_s: float
    seer_speedup: float
    seer_tail_reduction: float
    verl_preemptions: int | None = None


@dataclass(frozen=True)
class Cluster:
    instance: InstanceSpec
    num_instances: int

    def __post_init__(self) -> None:
        if self.num_instances < 1:
            raise ValueError(f"a cluster needs >= 1 instance, got {self.num_instances}")

    @property
    def num_gpus(self) -> int:
        return self.instance.gpus * self.num_instances

    def with_kv_fraction(self, fraction: float) -> "Cluster":
        """The same cluster with ``fraction`` of the memory-derived KV capacity (a fitted unknown)."""
        if not 0 < fraction <= 1:
            raise ValueError(f"kv fraction must be in (0, 1], got {fraction}")
        kv = max(1, int(self.instance.memory_kv_tokens * fraction))
        return replace(self, instance=replace(self.instance, kv_tokens=kv))


@dataclass(frozen=True)
class Preset:
    name: str
    model: str
    gpus: int
    gpus_per_instance: int
    num_requests: int
    group_size: int
    max_tokens: int
    mean_tokens: int
    prompt_tokens: int             # assumed mean prompt length (not in Table 3)
    paper: PaperTargets
    accelerator: str = "h800"
    kv_shards: int = 0             # 0: derived (see InstanceSpec)

    @property
    def num_groups(self) -> int:
        return self.num_requests // self.group_size

    def cluster(self) -> Cluster:
        inst = InstanceSpec(get_accelerator(self.accelerator), get_model(self.model), self.gpus_per_instance,
                            kv_shards=self.kv_shards)
        return Cluster(inst, self.gpus // self.gpus_per_instance)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("moonlight", "moonlight-16b-a3b", 32, 1, 3200, 8, 65536, 22386, 512,
           PaperTargets(3910, 1817, 1.78, 0.84)),
    Preset("qwen2vl-72b", "qwen2-vl-72b", 128, 8, 9600, 16, 40960, 7615, 2048,
           PaperTargets(3957, 2301, 2.04, 0.94, verl_preemptions=13686)),
    Preset("kimi-k2", "kimi-k2", 256, 32, 6400, 8, 98304, 38959, 1024,
           PaperTargets(12202, 3144, 1.48, 0.72), kv_shards=32),  # data-parallel attention across the instance
)}


@dataclass(frozen=True)
class WorkloadGroup:
    prompt_len: int
    lengths: tuple[int, ...]
    prompt_token_ids: tuple[int, ...] | None = None
    token_ids: tuple[tuple[int, ...], ...] | None = None
    key: str = ""


@dataclass(frozen=True)
class Workload:
    name: str
    groups: tuple[WorkloadGroup, ...]
    max_tokens: int
    cluster: Cluster
    source: str = ""
    acceptance: str = "math_cot"   # acceptance model for length-only speculation (presets: the paper's own)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError(f"workload {self.name}: no groups")
        sizes = {len(g.lengths) for g in self.groups}
        if len(sizes) != 1:
            raise ValueError(f"workload {self.name}: groups of different sizes {sorted(sizes)}")
        for g in self.groups:
            if g.prompt_len < 1 or min(g.lengths) < 0:
                raise ValueError(f"workload {self.name}, group {g.key!r}: negative length or empty prompt")

    @property
    def group_size(self) -> int:
        return len(self.groups[0].lengths)

    @property
    def num_requests(self) -> int:
        return len(self.groups) * self.group_size

    @property
    def has_token_ids(self) -> bool:
        return all(g.token_ids is not None and g.prompt_token_ids is not None for g in self.groups)

    @property
    def total_tokens(self) -> int:
        return sum(sum(g.lengths) for g in self.groups)

    def describe(self) -> dict:
        lens = np.array([n for g in self.groups for n in g.lengths])
        return {"name": self.name, "source": self.source, "groups": len(self.groups), "group_size": self.group_size,
                "requests": self.num_requests, "max_tokens": self.max_tokens, "mean_tokens": float(lens.mean()),
                "p99_tokens": float(np.percentile(lens, 99)), "at_max_frac": float((lens >= self.max_tokens).mean()),
                "instances": self.cluster.num_instances, "gpus": self.cluster.num_gpus}

    def to_groups(self, quantum: int = 1) -> list[GroupInput]:
        """Driver input at a token quantum (real token ids only at quantum 1)."""
        if quantum < 1:
            raise ValueError(f"token quantum must be >= 1, got {quantum}")
        real = quantum == 1 and self.has_token_ids
        max_sim = -(-self.max_tokens // quantum)
        params = SamplingParams(temperature=1.0, max_tokens=max_sim, ignore_eos=True)
        out: list[GroupInput] = []
        rid = 0
        for gi, g in enumerate(self.groups):
            lens = tuple(max(1, -(-min(n, self.max_tokens) // quantum)) for n in g.lengths)
            if real:
                prompt = g.prompt_token_ids or ()
                forced = tuple(tuple(t[:self.max_tokens]) or (0,) for t in g.token_ids or ())
            else:
                p = max(1, -(-g.prompt_len // quantum))
                base = PROMPT_TOKEN_BASE + gi * 65536
                prompt = tuple(range(base, base + p))
                forced = tuple((RESPONSE_TOKEN_BASE + rid + i,) * n for i, n in enumerate(lens))
            rid += len(lens)
            out.append(GroupInput(prompt, len(lens), params, key=g.key or f"g{gi}", forced=forced,
                                  true_lengths=tuple(len(f) for f in forced)))
        return out


def preset_workload(name: str, sigma: float = 1.0, icc: float = 0.74, seed: int = 0,
                    cluster: Cluster | None = None, num_groups: int | None = None) -> Workload:
    """A preset's requests with log-normal group-correlated lengths (``lengths.py``) and prompt lengths;
    ``num_groups``: that many groups of the same distributions instead of the preset's count."""
    if name not in PRESETS:
        raise ValueError(f"unknown workload {name!r}; presets: {', '.join(PRESETS)} (or give --trace FILE)")
    p = PRESETS[name]
    n = num_groups or p.num_groups
    lengths = LengthModel(p.mean_tokens, p.max_tokens, sigma, icc).sample(n, p.group_size, seed)
    rng = np.random.default_rng(seed + 1)
    prompts = np.clip(np.rint(p.prompt_tokens * np.exp(0.5 * rng.standard_normal(n) - 0.125)),
                      16, 8 * p.prompt_tokens).astype(int)
    groups = tuple(WorkloadGroup(int(prompts[i]), tuple(int(x) for x in lengths[i]), key=f"{name}-{i}")
                   for i in range(n))
    return Workload(name, groups, p.max_tokens, cluster or p.cluster(),
                    f"preset {name}: lognormal lengths, sigma {sigma:.3f}, icc {icc:.3f}, seed {seed}", "paper")


def trace_workload(path: str | Path, cluster: Cluster, limit: int | None = None, sample: int | None = None,
                   seed: int = 0, max_tokens: int | None = None) -> Workload:
    """Groups of a trace file (token-id or length-only format); ``max_tokens`` defaults to the trace's generation
    limit (``generation_limit``, over the whole file: never a sample's own longest response)."""
    everything = load_trace(path, limit=limit)
    groups = sample_groups(everything, sample, seed)
    if not groups:
        raise ValueError(f"trace {path} has no groups")
    cap = max_tokens if max_tokens is not None else generation_limit(everything)
    if cap < 1:
        raise ValueError(f"max_tokens must be >= 1, got {cap}")
    out = []
    for g in groups:
        ids = tuple(r.token_ids for r in g.responses) if g.has_token_ids else None
        out.append(WorkloadGroup(max(g.prompt_len, 1), tuple(r.length for r in g.responses), g.prompt_token_ids,
                                 ids, key=g.group_id))  # type: ignore[arg-type]
    return Workload(Path(path).name, tuple(out), cap, cluster, f"trace {path}")


def default_quantum(workload: Workload, max_sim_tokens: int = 1_000_000) -> int:
    """The smallest power of two that keeps the simulated tokens of the whole rollout under ``max_sim_tokens``
    (1 for small traces: step-exact, real suffix trees); a few hundred steps per long response remain."""
    q = 1
    while workload.total_tokens / q > max_sim_tokens:
        q *= 2
    return q
