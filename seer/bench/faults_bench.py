"""``seer bench faults``: the chaos matrix. Kill an instance at each risky moment, on each backend, and check
that the rollout loses and duplicates nothing.

Why: an instance is lost mid-rollout sooner or later in a long RL job (a node fails, the OOM killer, a Ray
actor restart), and the moments where a loss can corrupt a rollout are narrow: mid-step, in the middle of an
eviction to the pool, in the middle of a chunk start that imports pool KV, during a weight update, between
rollouts. Each cell of the matrix kills instance 1 at one of them and then checks, against a fault-free
greedy run of the same groups: every group has exactly G responses, none twice, the tokens are those of the
fault-free run, and the KV pool is empty afterwards. A weight update that loses an instance must fail with a
clear error, and the next update must bring every instance back at the new weights. In-process instances
cannot die between rollouts or during a weight update (there is no process to kill): those cells are "n/a".
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from seer.engine.config import EngineConfig
from seer.engine.speculator import SpecConfig
from seer.rollout.config import RolloutConfig
from seer.utils.config_loader import to_dict
from seer.utils.io import write_json
from seer.utils.machine import machine_info

POINTS = ("step", "evict", "import", "weights", "between")
BACKENDS = ("inprocess", "local", "ray")
VICTIM = 1  # the instance each cell kills


@dataclass
class Cell:
    backend: str
    point: str
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    skipped: str = ""  # why the cell does not apply to the backend
    failed_instances: int = 0
    kv_entries_dropped: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def fault_groups(n: int = 4, g: int = 4, max_tokens: int = 24) -> list:
    """Greedy groups of known lengths (they stop at a recorded length), so every run must give equal tokens."""
    from seer.rollout.types import GroupInput
    from seer.sampling_params import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return [GroupInput(tuple(range(5 + i, 17 + 2 * i)), g, sp, key=f"p{i}",
                       stop_lengths=tuple(8 + (3 * i + 5 * j) % 17 for j in range(g))) for i in range(n)]


def check_rollout(out, groups: list, reference: list[list[int]]) -> list[str]:
    """What a rollout that lost an instance must still satisfy; returns the violations."""
    problems = []
    res = out.result
    sizes = [len(v) for v in res.groups().values()]
    if sizes != [g.size for g in groups]:
        problems.append(f"responses per group {sizes}")
    keys = [(r.group_id, r.index) for r in res.responses]
    if len(set(keys)) != len(keys):
        problems.append("a response appears twice")
    if [r.token_ids for r in res.responses] != reference:
        problems.append("tokens differ from the fault-free run")
    return problems


def run_cell(make: Callable[[], Any], backend: str, point: str, groups: list, reference: list[list[int]],
             policy: str = "context") -> Cell:
    """One cell of the matrix on a fresh coordinator from ``make``."""
    from seer.rollout.types import FaultPlan

    cell = Cell(backend, point)
    if backend == "inprocess" and point in ("weights", "between"):
        cell.ok, cell.skipped = True, "n/a: no process to kill"
        return cell
    t0 = time.perf_counter()
    with make() as c:
        if point in ("step", "evict", "import"):
            out = c.rollout(groups, policy=policy, progress=False, fault=FaultPlan(VICTIM, 0.0, during=point))
            cell.failed_instances = int(out.result.stats.get("failed_instances", 0))
            if cell.failed_instances != 1:
                cell.problems.append(f"the fault did not fire ({cell.failed_instances} instances failed)")
        elif point == "between":
            c.rollout(groups, policy=policy, progress=False)
            c.backend.kill_instance(VICTIM)
            out = c.rollout(groups, policy=policy, progress=False)
        else:
            out = _weights_cell(c, cell, groups, policy)
        cell.problems += check_rollout(out, groups, reference)
        cell.kv_entries_dropped = int(out.result.stats.get("kv_entries_dropped", 0))
        left = c.backend.kv_entries()
        if left:
            cell.problems.append(f"{left} KV pool entries left")
    cell.seconds = round(time.perf_counter() - t0, 2)
    cell.ok = not cell.problems
    return cell


def _weights_cell(c, cell: Cell, groups: list, policy: str):
    """Lose an instance as a weight update starts: a clear error, then the next update recovers everyone."""
    c.update_weights(c.model)  # instances up and at version 1 (the same weights: greedy tokens stay)
    c.backend.after_weights_sent = lambda: c.backend.kill_instance(VICTIM)
    try:
        c.update_weights(c.model)
        cell.problems.append("a weight update that lost an instance did not fail")
    except RuntimeError as err:
        if "weight update" not in str(err):
            cell.problems.append(f"unclear error: {err}")
    c.backend.after_weights_sent = None
    version = c.update_weights(c.model)  # the same weights again: greedy tokens must not change
    out = c.rollout(groups, policy=policy, progress=False)
    if {rec["weight_version"] for rec in out.records()} != {version}:
        cell.problems.append(f"responses not all at weight version {version}")
    return out


def matrix_config(dtype: str = "float32", num_kv_blocks: int = 24) -> RolloutConfig:
    """Two instances with KV so small (blocks of 4 tokens, chunks of 6) that requests move between them often."""
    engine = EngineConfig(dtype=dtype, block_size=4, num_kv_blocks=num_kv_blocks)
    return RolloutConfig(instances=2, chunk_tokens=6, engine=engine, spec=SpecConfig(adaptive=False),
                         stall_timeout_s=60.0)


def run_matrix(model: str, backends: list[str], points: list[str], config: RolloutConfig,
               policy: str = "context", progress: Callable[[Cell], None] = lambda cell: None) -> list[Cell]:
    """Every (backend, point) cell, each against one fault-free in-process reference run."""
    from seer.rollout.coordinator import RolloutCoordinator

    groups = fault_groups()
    alone = replace(config, instances=1, engine=replace(config.engine, num_kv_blocks=400))
    with RolloutCoordinator(model, alone) as ref:
        reference = [r.token_ids for r in ref.rollout(groups, policy="verl", progress=False).result.responses]
    cells = []
    for backend in backends:
        for point in points:
            def make(backend: str = backend) -> RolloutCoordinator:
                return RolloutCoordinator(model, replace(config, backend=backend))
            cells.append(run_cell(make, backend, point, groups, reference, policy))
            progress(cells[-1])
    return cells


def add_parser(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("faults", help="kill an instance at each risky moment on each backend; check the rollout")
    p.add_argument("--model", default=None, help="model directory or known name (default: SmolLM2-135M)")
    p.add_argument("--backends", default="inprocess,local", help=f"comma list of {', '.join(BACKENDS)}")
    p.add_argument("--points", default=",".join(POINTS), help=f"comma list of {', '.join(POINTS)}")
    p.add_argument("--num-kv-blocks", type=int, default=24, help="KV blocks of 4 tokens per instance (small: KV moves)")
    p.add_argument("--dtype", default="float32", help="float32 (exact greedy comparisons) or auto")
    p.add_argument("--json", default=None,
                   help="write the report here as JSON (a PNG plot beside it where the command makes one)")
    p.set_defaults(func=run)


def _split(value: str, known: tuple[str, ...], what: str) -> list[str]:
    items = [v for v in value.split(",") if v]
    bad = [v for v in items if v not in known]
    if bad or not items:
        raise ValueError(f"unknown {what} {', '.join(bad) or '(none given)'}; choose from {', '.join(known)}")
    return items


def run(args: argparse.Namespace) -> int:
    from seer.models.prepare import resolve_model

    backends = _split(args.backends, BACKENDS, "backends")
    points = _split(args.points, POINTS, "fault points")
    config = matrix_config(args.dtype, args.num_kv_blocks)

    def show(cell: Cell) -> None:
        print(json.dumps({"backend": cell.backend, "point": cell.point, "ok": cell.ok, "problems": cell.problems,
                          "skipped": cell.skipped, "seconds": cell.seconds}), flush=True)

    cells = run_matrix(str(resolve_model(args.model)), backends, points, config, progress=show)
    report = {"cells": [c.to_dict() for c in cells], "all_ok": all(c.ok for c in cells),
              "setup": {"backends": backends, "points": points, "victim": VICTIM, "config": to_dict(config),
                        "machine": machine_info(config.engine.dtype)}}
    write_json(args.json, report)
    print(f"{sum(c.ok for c in cells)}/{len(cells)} cells ok")
    return 0 if report["all_ok"] else 1
