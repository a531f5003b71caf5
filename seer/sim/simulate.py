"""Run rollout policies on simulated instances and report them exactly like ``seer bench rollout``.

Why one entry point: the simulator is only worth its numbers if it runs the same control plane as the engine
(request buffer, orderings, dispatcher, scheduler, block manager, suffix trees) and measures with the same
metric code. So ``run_policy`` runs the engine backends' rollout template (``SimBackend``: the real
``RolloutDriver`` built from a ``RolloutConfig``) over ``SimInstance``s (the engine's scheduler priced by the cost
model) and keeps what the plots need (busy intervals, per-step running requests and
KV use, finish times); ``simulate`` runs several policies on one workload and returns ``compare(...)``'s JSON
plus a ``sim`` section (cluster, cost constants, token quantum, simulator speed: events = instance steps
processed by the discrete-event loop, and sequence-steps = scheduled requests over all those steps).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from seer.engine.config import EngineConfig, verl_rollout_engine
from seer.engine.speculator import SpecConfig
from seer.rollout.config import RolloutConfig
from seer.rollout.metrics import compare, reference_ratios
from seer.rollout.orderings import OrderingConfig
from seer.rollout.policies import RolloutPolicy, get_policy
from seer.rollout.types import GroupInput, RolloutResult
from seer.sim.acceptance import AcceptanceModel
from seer.sim.backend import SimBackend
from seer.sim.cost_model import CostConstants, CostModel, StepSummary
from seer.sim.model_speculator import ModelSpeculator
from seer.sim.sim_instance import SimInstance, Timeline, simulated_engine
from seer.sim.speculation import SimSpecConfig
from seer.sim.workloads import Cluster, Workload, default_quantum
from seer.spec.draft_server import DraftServer
from seer.spec.policy import VerifyCostModel


@dataclass(frozen=True)
class SimConfig:
    """Engine and rollout settings shared by every policy of a run (real-token units)."""

    quantum: int = 0                   # simulated token = this many real tokens; 0: pick (default_quantum)
    chunk_tokens: int = 8192           # divided rollout chunk
    engine: EngineConfig = field(default_factory=verl_rollout_engine)  # each instance's engine (veRL's vLLM)
    spec: SimSpecConfig = field(default_factory=SimSpecConfig)
    acceptance: str = "auto"           # "replay" (suffix trees; token ids, quantum 1) or an acceptance model name
    accept_scale: float = 1.0          # scales the model's tokens gained per verification (AcceptanceModel.scaled)
    ordering: OrderingConfig = field(default_factory=OrderingConfig)  # the context ordering, as on the engine
    check: bool = False                # integrity checks after every step (tests)
    record: bool = True                # per-step timelines for the plots

    def __post_init__(self) -> None:
        if self.quantum < 0 or self.chunk_tokens < 1:
            raise ValueError("quantum must be >= 0 and chunk_tokens >= 1")
        if self.accept_scale <= 0:
            raise ValueError(f"accept_scale must be > 0, got {self.accept_scale}")


@dataclass
class PolicyRun:
    policy: str
    result: RolloutResult
    busy: dict[int, list[tuple[float, float]]]
    timelines: dict[int, Timeline]
    wall_s: float
    events: int
    spec: dict | None = None

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def seq_steps(self) -> int:
        """Sequence-steps simulated: one per scheduled request per instance step (each stands for q tokens)."""
        return sum(len(step) for steps in self.result.decisions.values() for step in steps)


def resolve_quantum(workload: Workload, config: SimConfig) -> int:
    return config.quantum or default_quantum(workload)


def _speculators(workload: Workload, config: SimConfig, quantum: int, cost: CostModel,
                 models: dict[str, AcceptanceModel], instances: int) -> tuple[list[Any], DraftServer | None]:
    """One speculator per instance and the draft server they share: the engine's, over one draft server
    (token-id traces at quantum 1: real suffix trees, exact acceptance; each instance holds its steps' tokens until
    the step ends, as engine instances do), else one fitted acceptance model shared by all and no server
    (``workload.acceptance``: the paper's for presets)."""
    mode = config.acceptance
    if mode == "auto":
        mode = "replay" if quantum == 1 and workload.has_token_ids else workload.acceptance
    if mode == "replay":
        if quantum != 1 or not workload.has_token_ids:
            raise ValueError("replayed speculation needs a token-id trace at token quantum 1")
        if config.accept_scale != 1:
            raise ValueError("accept_scale applies to an acceptance model; replayed suffix trees accept what "
                             "they accept (pass --acceptance paper or math_cot to scale a model)")
        from seer.engine.speculator import Speculator
        from seer.spec.draft_server import DraftServerConfig
        from seer.spec.drafter import DrafterConfig

        gamma = config.spec.gamma_max
        server = DraftServer(DraftServerConfig(drafter=DrafterConfig(gamma_max=gamma), keep_history=False))
        return [Speculator.build(SpecConfig(gamma_max=gamma), VerifyCostModel([1], [1], [[1.0]]), server)
                for _ in range(instances)], server
    if mode not in models:
        raise ValueError(f"unknown acceptance model {mode!r}; known: replay, {', '.join(models)}")
    return [ModelSpeculator(config.spec, models[mode].scaled(config.accept_scale), cost, quantum)] * instances, None


def _instance_spec_stats(instances: Sequence[SimInstance]) -> dict:
    drafted = sum(i.scheduler.stats.spec_drafted for i in instances)
    accepted = sum(i.scheduler.stats.spec_accepted for i in instances)
    bonus = sum(i.scheduler.stats.spec_bonus for i in instances)
    steps = sum(i.scheduler.stats.spec_steps for i in instances)
    return {"drafted": drafted, "accepted": accepted, "verification_steps": steps,
            "tau": (accepted + bonus) / steps if steps else 0.0, "accept_rate": accepted / drafted if drafted else 0.0}


def run_policy(workload: Workload, policy: RolloutPolicy | str, cluster: Cluster | None = None,
               constants: CostConstants | None = None, config: SimConfig | None = None, *,
               progress: bool = False, acceptance_models: dict[str, AcceptanceModel] | None = None) -> PolicyRun:
    """One policy on one workload, in virtual time, through the engine's rollout template (``SimBackend``)."""
    policy = get_policy(policy) if isinstance(policy, str) else policy
    cluster = cluster or workload.cluster
    config = config or SimConfig()
    q = resolve_quantum(workload, config)
    cost = CostModel(cluster.instance, constants)
    groups = workload.to_groups(q)
    max_model_len = max(len(g.prompt_token_ids) for g in groups) + groups[0].params.max_tokens + 1
    chunk = max(1, -(-config.chunk_tokens // q))
    rollout = RolloutConfig(policy=policy.name, instances=cluster.num_instances, chunk_tokens=chunk,
                            engine=simulated_engine(config.engine, cluster.instance.kv_capacity_tokens, q),
                            spec=SpecConfig(gamma_max=config.spec.gamma_max), ordering=config.ordering,
                            kv_affinity_spread=None)

    def speculators(_: RolloutPolicy) -> tuple[list[Any], DraftServer | None]:
        from seer.sim.fitted import acceptance_models as fitted_models
        return _speculators(workload, config, q, cost, acceptance_models or fitted_models(), cluster.num_instances)

    backend = SimBackend(rollout, cost, decode_profile(cost, groups, config, q), max_model_len=max_model_len,
                         quantum=q, speculators=speculators, price_drafts=True, record=config.record,
                         check=config.check)
    t0 = time.perf_counter()
    result = backend.run(policy, groups, chunk, progress, None)
    wall = time.perf_counter() - t0
    timelines = {i.instance_id: i.timeline for i in backend.last if i.timeline is not None}
    spec = _instance_spec_stats(backend.last) if policy.speculative else None
    return PolicyRun(policy.name, result, result.stats["busy"], timelines, wall, result.stats["steps"], spec)


def decode_profile(cost: CostModel, groups: Sequence[GroupInput], config: SimConfig,
                   quantum: int) -> VerifyCostModel:
    """The step profile critical-path placement reads: decode steps of every batch size up to the engine's limit
    (powers of two) at the workload's mean context (the prompt and half a response; groups are in simulated
    tokens of ``quantum`` real ones), one token each, priced by the cost model."""
    lengths = [n for g in groups for n in (g.true_lengths or (g.params.max_tokens,) * g.size)]
    ctx = sum(len(g.prompt_token_ids) * g.size for g in groups) / len(lengths) + sum(lengths) / len(lengths) / 2
    sizes = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if b <= config.engine.max_num_seqs]
    times = [[cost.step_time(StepSummary.decode(b, b * ctx * quantum))] for b in sizes]
    return VerifyCostModel(sizes, [1], times)


def report(runs: Sequence[PolicyRun], workload: Workload, cluster: Cluster, constants: CostConstants,
           config: SimConfig) -> dict:
    """``compare(...)``'s JSON (same keys as ``seer bench rollout``) plus a ``sim`` section."""
    rows = {r.policy: r.result.metrics for r in runs}
    baseline = "verl" if "verl" in rows else runs[0].policy
    out = compare(rows, baseline=baseline)
    for r in runs:
        row = out["policies"][r.policy]
        row["kv_budget_tokens"] = cluster.instance.kv_capacity_tokens
        if r.spec is not None:
            row["spec"] = r.spec
    out.update(reference_ratios({name: m.throughput_tok_s for name, m in rows.items()}))
    q = resolve_quantum(workload, config)
    out["sim"] = {"workload": workload.describe(), "cost": CostModel(cluster.instance, constants).describe(),
                  "config": {**asdict(config), "quantum": q},
                  "speed": {r.policy: {"wall_s": r.wall_s, "events": r.events, "events_per_s": r.events_per_s,
                                       "seq_steps": r.seq_steps,
                                       "seq_steps_per_s": r.seq_steps / r.wall_s if r.wall_s > 0 else 0.0}
                            for r in runs}}
    return out


def simulate(workload: Workload, policies: Sequence[str], cluster: Cluster | None = None,
             constants: CostConstants | None = None, config: SimConfig | None = None, *, progress: bool = False,
             plots_dir: str | None = None) -> dict:
    """Run ``policies`` on ``workload``; returns the report (and writes PNG plots to ``plots_dir``)."""
    if not policies:
        raise ValueError("no policy to simulate")
    cluster = cluster or workload.cluster
    constants = constants or CostConstants()
    config = config or SimConfig()
    runs = [run_policy(workload, p, cluster, constants, config, progress=progress) for p in policies]
    out = report(runs, workload, cluster, constants, config)
    if plots_dir is not None:
        from seer.sim.plots import write_plots
        out["plots"] = write_plots(runs, plots_dir)
    return out
