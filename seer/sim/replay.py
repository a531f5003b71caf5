"""``seer simulate --replay REPORT``: a measured ``seer bench rollout`` run again on simulated instances, priced by
what the engine paid in it, with the simulated figures beside the measured ones.

Why: the simulator's cluster figures are worth what its predictions of the engine are worth. A replay puts the
run's groups (trace, sample, seed, scale, budget), its rollout config (instances, chunk, KV blocks, engine limits,
drafting, ordering) and its policies, in the order they ran, through the engine's rollout template on simulated
instances (``backend.py``), whose steps, transfers and drafting cost what the run's cost (``engine_prices.py``).
Whatever still differs is the simulator's error: per policy it reports makespan, tail, p90, idle share, steps,
mean batch and KV bytes moved, simulated against measured, and their relative error.

Token-id traces replay exactly what the engine computed (forced tokens, so sibling drafts are accepted as they
were). On a length-only trace the engine sampled the tokens; the bench keeps them beside the report
(``tokens_path``: one gzipped JSON line per sample and policy), and the replay forces each policy's own. Without
that file the replay gives each response random tokens of its recorded length, so drafting accepts next to
nothing and speculative policies are predicted slower than they ran; the report says which (``tokens``).
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from seer.engine.config import EngineConfig
from seer.rollout.policies import get_policy
from seer.rollout.step_cost import LinearStepCost
from seer.rollout.types import GroupInput, RolloutResult
from seer.sim.backend import SimBackend
from seer.sim.engine_prices import EnginePrices, FittedCost
from seer.spec.policy import VerifyCostModel

COMPARED = ("makespan_s", "tail_s", "p90_s", "idle_share", "steps", "mean_batch", "kv_bytes_moved")


def tokens_path(report: str | Path) -> Path:
    """Where a report on a length-only trace keeps the tokens its engine sampled, per sample and policy."""
    return Path(report).with_suffix(".tokens.jsonl.gz")


def sampled_tokens(report: str | Path) -> dict[tuple[int, str], list[list[int]]]:
    """The tokens each policy's engine sampled in each sample (seed) of ``report``, where it kept them (a line
    written twice, by a sample that was run again, counts once: the last)."""
    import gzip

    path = tokens_path(report)
    if not path.is_file():
        return {}
    out: dict[tuple[int, str], list[list[int]]] = {}
    with gzip.open(path, "rt") as f:
        for lineno, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
                out[(int(rec["seed"]), str(rec["policy"]))] = [list(map(int, t)) for t in rec["tokens"]]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{path}:{lineno}: malformed token record ({err})") from None
    return out


def engine_facts(model: Path, engine: EngineConfig) -> dict[str, Any]:
    """What a replay needs to know of the model the run used and of its instances' limits."""
    from seer.models.config import ModelConfig
    from seer.utils.kv_size import kv_bytes_per_token

    mc = ModelConfig.from_dir(model)
    return {"vocab_size": mc.vocab_size, "eos_token_ids": list(mc.eos_token_ids),
            "max_model_len": engine.model_len(mc.max_position_embeddings),
            "kv_bytes_per_token": kv_bytes_per_token(mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim,
                                                     engine.dtype_bytes)}


def profile_from_fit(fit: LinearStepCost, context: float = 128.0) -> VerifyCostModel:
    """The verify table the engine's profiler measures (batches 1/4/16, 1/3/9 tokens), priced by ``fit`` at a
    ``context``-token context, with its per-pair and per-read slopes: for reports that did not record the
    profile."""
    batches, tokens = [1, 4, 16], [1, 3, 9]
    times = [[fit.step_time(b, b * n, b * n * context, reads=b * context) for n in tokens] for b in batches]
    return VerifyCostModel(batches, tokens, times, 0.0, pair_s=fit.per_pair_s, context=context,
                           read_s=fit.per_read_s)


def _namespace(recorded: dict[str, Any]) -> argparse.Namespace:
    """The bench's rollout arguments: their defaults, overridden by what the report recorded."""
    from seer.rollout.arguments import rollout_defaults

    ns = rollout_defaults()
    for key, value in recorded.items():
        if hasattr(ns, key):
            setattr(ns, key, value)
    return ns


def _forced(group: GroupInput, forced: tuple[tuple[int, ...], ...]) -> GroupInput:
    return replace(group, forced=forced, stop_lengths=None, params=replace(group.params, ignore_eos=False))


def with_tokens(groups: list[GroupInput], seed: int, vocab: int,
                 sampled: list[list[int]] | None) -> list[GroupInput]:
    """Length-only groups given the tokens the engine sampled for them (responses in group order), else random
    tokens of their recorded lengths (siblings unalike)."""
    out, at = [], 0
    for g in groups:
        if g.forced is not None or g.stop_lengths is None:
            out.append(g)
        elif sampled is not None:
            out.append(_forced(g, tuple(tuple(t) for t in sampled[at:at + g.size])))
        else:
            rng = random.Random(f"{seed}:{g.key}")
            out.append(_forced(g, tuple(tuple(rng.randrange(3, vocab) for _ in range(n)) for n in g.stop_lengths)))
        at += g.size
    return out


def _sim_row(result: RolloutResult, instances: int) -> dict[str, Any]:
    m = result.metrics
    row = m.to_dict()
    row["idle_share"] = sum(m.idle_s) / (instances * m.makespan_s)
    if "spec" in result.stats:
        row["spec"] = {k: v for k, v in result.stats["spec"].items() if k in ("tau", "accept_rate", "drafted")}
    return row


def _measured(row: dict[str, Any]) -> dict[str, Any]:
    split = row.get("time_split", {})
    return {**{k: row.get(k) for k in COMPARED}, "idle_share": split.get("idle_share")}


def _errors(sim: dict[str, Any], measured: dict[str, Any]) -> dict[str, float | None]:
    return {k: (sim[k] / measured[k] - 1.0) if measured.get(k) else None for k in COMPARED}


class SampleReplay:
    """One sample of a report: its groups and config rebuilt, its prices fitted, ready to run policies."""

    def __init__(self, sample: dict[str, Any], top: dict[str, Any], trace: str | None = None,
                 tokens: dict[tuple[int, str], list[list[int]]] | None = None) -> None:
        from seer.rollout.arguments import replay_options, rollout_config
        from seer.rollout.workload import groups_from_trace

        setup = {**top, **sample["setup"]}
        recorded = sample.get("replay", {})
        args = recorded.get("args") or setup  # older reports: the flags their setup recorded
        if not recorded.get("args") and not {"limit", "sample", "seed"} <= set(setup):
            raise ValueError("the report does not record which groups it ran (no replay.args, no limit/sample/seed "
                             "in its setup): rerun it with this version of `seer bench rollout`")
        seed = int(setup.get("seed", args.get("seed", 0)))  # a --samples report: the sample's own
        self.ns = _namespace({**args, "seed": seed, **({"trace": trace} if trace else {})})
        if not Path(self.ns.trace).is_file():
            raise FileNotFoundError(f"trace {self.ns.trace!r} (recorded in the report) not found: run from the "
                                    f"directory the bench ran in, or pass --trace")
        facts = recorded.get("engine") or self._facts(setup)
        self.facts = facts
        self.seed = seed
        self.trace_groups = groups_from_trace(self.ns.trace, facts["vocab_size"], replay_options(self.ns))
        if "groups" in setup and len(self.trace_groups) != setup["groups"]:
            raise ValueError(f"the replay rebuilt {len(self.trace_groups)} groups where the run had {setup['groups']}: "
                             f"the trace or the report's settings differ from the run's")
        self.length_only = any(g.forced is None for g in self.trace_groups)
        self.tokens = {policy: t for (seed, policy), t in (tokens or {}).items() if seed == self.seed}
        kv_tokens = setup["kv_budget"]["kv_tokens_per_instance"]
        self.config = rollout_config(self.ns, "verl", num_kv_blocks=kv_tokens // self.ns.block_size)
        self.prices = EnginePrices.from_report(sample, facts["kv_bytes_per_token"])
        profile = recorded.get("profile")
        self.profile = (VerifyCostModel.from_profile(profile) if profile else profile_from_fit(self.prices.step))
        self.order = list(sample["policies"])  # the order they ran in: each rollout's driver seed follows it
        self.measured = sample["policies"]

    def _facts(self, setup: dict[str, Any]) -> dict[str, Any]:
        from seer.models.prepare import resolve_model

        dtype = setup.get("dtype") or setup.get("machine", {}).get("dtype") or "float32"
        return engine_facts(resolve_model(setup.get("model")), EngineConfig(dtype=dtype,
                                                                            max_model_len=self.ns.max_model_len))

    def groups(self, name: str) -> list[GroupInput]:
        """The groups as ``name`` ran them: length-only responses carry the tokens its engine sampled."""
        return with_tokens(self.trace_groups, self.seed, self.facts["vocab_size"], self.tokens.get(name))

    def run(self, name: str, progress: bool = False) -> RolloutResult:
        backend = SimBackend(self.config, FittedCost(self.prices), self.profile,
                             max_model_len=self.facts["max_model_len"],
                             eos_token_ids=tuple(self.facts["eos_token_ids"]))
        backend.rollouts = self.order.index(name) if name in self.order else len(self.order)
        return backend.run(get_policy(name), self.groups(name), self.config.chunk_tokens, progress, None)

    def compare(self, policies: list[str], progress: bool = False) -> dict[str, Any]:
        """Each policy simulated; beside it the measured row and the relative errors where the run had it."""
        out: dict[str, Any] = {"seed": self.seed, "prices": self.prices.to_dict(), "policies": {}, "measured": {},
                               "error": {}, "tokens": {}}
        for name in policies:
            sim = _sim_row(self.run(name, progress), self.config.instances)
            out["policies"][name] = sim
            out["tokens"][name] = "sampled" if name in self.tokens else "random" if self.length_only else "trace"
            if name in self.measured:
                measured = _measured(self.measured[name])
                out["measured"][name] = measured
                out["error"][name] = _errors(sim, measured)
        return out


def load_report(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A bench report's samples (one for a single-sample report) and the setup they share."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"report not found: {p}")
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{p}: not JSON ({err})") from None
    if "samples" in doc:
        return list(doc["samples"]), dict(doc.get("setup", {}))
    if "policies" in doc and "setup" in doc:
        return [doc], {}
    raise ValueError(f"{p}: not a `seer bench rollout` report (no policies and setup)")


def replay(path: str | Path, policies: list[str] | None = None, *, trace: str | None = None,
           progress: bool = False) -> dict[str, Any]:
    """Every sample of the report at ``path`` replayed under ``policies`` (default: the ones it ran)."""
    samples, top = load_report(path)
    tokens = sampled_tokens(path)
    out: dict[str, Any] = {"replay": str(path), "samples": []}
    for sample in samples:
        rep = SampleReplay(sample, top, trace, tokens)
        out["samples"].append(rep.compare(policies or rep.order, progress))
    out["summary"] = summarize(out["samples"])
    return out


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Over every (sample, policy) pair with a measurement: how many, and the largest |error| of each figure."""
    pairs = [(s["seed"], name, err) for s in samples for name, err in s["error"].items()]
    worst = {k: max((abs(e[k]) for _, _, e in pairs if e[k] is not None), default=None) for k in COMPARED}
    within = sum(1 for _, _, e in pairs if e["makespan_s"] is not None and abs(e["makespan_s"]) <= 0.10
                 and e["tail_s"] is not None and abs(e["tail_s"]) <= 0.15)
    return {"pairs": len(pairs), "within_10pct_makespan_15pct_tail": within, "worst_abs_error": worst}


def table(out: dict[str, Any]) -> str:
    """Simulated against measured, one line per (sample, policy)."""
    lines = [f"{'seed':>4} {'policy':<16} {'makespan sim/meas':>20} {'err':>6} {'tail sim/meas':>16} {'err':>6} "
             f"{'idle':>11} {'steps err':>9} {'batch err':>9} {'moved err':>9}"]

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:+.0f}%"

    for s in out["samples"]:
        for name, sim in s["policies"].items():
            m, e = s["measured"].get(name), s["error"].get(name)
            if m is None or e is None:
                lines.append(f"{s['seed']:>4} {name:<16} {sim['makespan_s']:9.1f} / {'-':>8} {'':>6} "
                             f"{sim['tail_s']:7.1f} / {'-':>6}")
                continue
            lines.append(f"{s['seed']:>4} {name:<16} {sim['makespan_s']:9.1f} / {m['makespan_s']:8.1f} "
                         f"{pct(e['makespan_s']):>6} {sim['tail_s']:7.1f} / {m['tail_s']:6.1f} {pct(e['tail_s']):>6} "
                         f"{sim['idle_share']:.2f}/{(m['idle_share'] or 0):.2f} {pct(e['steps']):>9} "
                         f"{pct(e['mean_batch']):>9} {pct(e['kv_bytes_moved']):>9}")
        if "random" in s["tokens"].values():
            lines.append(f"     (seed {s['seed']}: a length-only trace whose sampled tokens were not kept: random "
                         f"tokens, so drafting is under-predicted)")
    summary = out["summary"]
    lines.append(f"{summary['within_10pct_makespan_15pct_tail']}/{summary['pairs']} pairs within 10% on makespan "
                 f"and 15% on tail")
    return "\n".join(lines)
