"""How Seer's gain moves with the cluster: a preset's workload per instance held fixed, 8 to 512 instances.

Why: the paper's result is a 32-256 GPU result, and how the gain moves with size is not obvious. At a fixed load
per instance, more instances mean more groups: the rollout's longest response is the maximum of more draws (a
longer tail for veRL to wait on), while each instance's share of the work stays the same, and divided rollout
can spread a long group over more instances. Each size runs the preset with its fitted unknowns
(``fitted.json``: length spread, KV fraction, step overhead) and one token quantum for all sizes, the preset's own,
so a simulated token means the same at every size and only the size changes.

    python -m seer.sim.scaling --workload moonlight --instances 8,16,32,64,128,256 --json out.json
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Sequence

from seer.rollout.metrics import compare
from seer.sim.fitted import preset_setup
from seer.sim.simulate import SimConfig, resolve_quantum, run_policy
from seer.utils.io import write_json


def scaling(name: str, sizes: Sequence[int], policies: Sequence[str] = ("verl", "seer"),
            progress: bool = False) -> dict[str, Any]:
    """Every policy at every size; per size the makespans, tails, speedups and the simulator's own wall time."""
    native, _, _ = preset_setup(name)
    config = SimConfig(quantum=resolve_quantum(native, SimConfig()), record=False)
    rows = []
    for n in sizes:
        workload, cluster, constants = preset_setup(name, instances=n)
        t0 = time.perf_counter()
        runs = {p: run_policy(workload, p, cluster, constants, config, progress=progress).result.metrics
                for p in policies}
        out = compare(runs, baseline=policies[0])
        rows.append({"instances": n, "groups": len(workload.groups), "requests": workload.num_requests,
                     "longest_tokens": max(max(g.lengths) for g in workload.groups),
                     "policies": {p: {"makespan_s": m.makespan_s, "tail_s": m.tail_s} for p, m in runs.items()},
                     "speedup": out[f"speedup_vs_{policies[0]}"],
                     "tail_reduction": out[f"tail_reduction_vs_{policies[0]}"],
                     "sim_wall_s": time.perf_counter() - t0})
        if progress:
            print(table_line(rows[-1], policies), file=sys.stderr, flush=True)
    return {"workload": name, "quantum": config.quantum, "policies": list(policies), "sizes": rows}


def table_line(row: dict[str, Any], policies: Sequence[str]) -> str:
    cells = " | ".join(f"{row['policies'][p]['makespan_s']:,.0f} s" for p in policies)
    gains = " | ".join(f"{row['speedup'][p]:.2f}x, tail -{100 * row['tail_reduction'][p]:.0f}%"
                       for p in policies[1:])
    return (f"| {row['instances']} | {row['groups']:,} | {row['longest_tokens']:,} | {cells} | {gains} | "
            f"{row['sim_wall_s']:.0f} s |")


def markdown(result: dict[str, Any]) -> str:
    pols = result["policies"]
    head = ("| instances | groups | longest response | " + " | ".join(f"{p} makespan" for p in pols) + " | "
            + " | ".join(f"{p} vs {pols[0]}" for p in pols[1:]) + " | simulated in |")
    lines = [head, "|" + "---|" * (5 + 2 * (len(pols) - 1))]
    lines += [table_line(row, pols) for row in result["sizes"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="moonlight", help="preset: moonlight, qwen2vl-72b, kimi-k2")
    ap.add_argument("--instances", default="8,16,32,64,128,256", help="comma list of cluster sizes")
    ap.add_argument("--policies", default="verl,seer", help="comma list; the first is the baseline")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.instances.split(",")]
    result = scaling(args.workload, sizes, args.policies.split(","), progress=True)
    print(markdown(result))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
