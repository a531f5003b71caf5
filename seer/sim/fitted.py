"""The fitted parameters of the simulator (``fitted.json``) and how to read them.

Why a data file: the reproduction must be auditable. ``fit.py`` writes every fitted number there with how it was
obtained (which trace, which targets, which search), and everything else reads it through these functions, so a
rerun of ``seer simulate --fit-baseline`` visibly changes one file and nothing else.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from seer.sim.acceptance import AcceptanceModel, paper_model
from seer.sim.cost_model import CostConstants
from seer.sim.workloads import PRESETS, Cluster, Workload, preset_workload

FITTED_PATH = Path(__file__).with_name("fitted.json")


@lru_cache(maxsize=4)
def _load(path: str) -> dict[str, Any]:
    p = Path(path)
    return json.loads(p.read_text()) if p.is_file() else {}


def load_fitted(path: Path | None = None) -> dict[str, Any]:
    """The whole fitted record ({} when the file does not exist yet)."""
    return _load(str(path or FITTED_PATH))


def acceptance_models(path: Path | None = None) -> dict[str, AcceptanceModel]:
    """Acceptance models by name: ``paper`` always, plus those fitted from replayed traces."""
    models = {"paper": paper_model()}
    for name, d in load_fitted(path).get("acceptance", {}).items():
        models[name] = AcceptanceModel.from_dict(d)
    return models


def length_icc(path: Path | None = None, default: float = 0.74) -> float:
    return float(load_fitted(path).get("length_icc", {}).get("value", default))


def preset_params(name: str, path: Path | None = None) -> dict[str, Any]:
    """Fitted unknowns of a preset (``sigma``, ``step_overhead_s``, ``kv_fraction``), {} if not fitted."""
    return dict(load_fitted(path).get("presets", {}).get(name, {}).get("params", {}))


def preset_setup(name: str, fitted: bool = True, seed: int = 0, path: Path | None = None,
                 instances: int | None = None, icc: float | None = None) -> tuple[Workload, Cluster, CostConstants]:
    """A preset's workload, cluster and cost constants, with its fitted unknowns unless ``fitted`` is False;
    ``instances``: that many instances, each with the preset's groups per instance; ``icc``: the within-group
    correlation of log lengths (default: the one measured on the CASTILLO traces)."""
    if name not in PRESETS:
        raise ValueError(f"unknown workload {name!r}; presets: {', '.join(PRESETS)} (or give --trace FILE)")
    params = preset_params(name, path) if fitted else {}
    cluster = PRESETS[name].cluster()
    groups = None
    if instances is not None:
        if instances < 1:
            raise ValueError(f"instances must be >= 1, got {instances}")
        groups = max(1, round(PRESETS[name].num_groups * instances / cluster.num_instances))
        cluster = replace(cluster, num_instances=instances)
    if "kv_fraction" in params:
        cluster = cluster.with_kv_fraction(float(params["kv_fraction"]))
    workload = preset_workload(name, sigma=float(params.get("sigma", 1.0)),
                               icc=length_icc(path) if icc is None else icc, seed=seed, cluster=cluster,
                               num_groups=groups)
    base = CostConstants()
    constants = CostConstants(step_overhead_s=float(params.get("step_overhead_s", base.step_overhead_s)))
    return workload, cluster, constants
