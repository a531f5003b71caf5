"""The package's layers: the library never imports its command line, and the control plane never imports torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "seer"
COMMAND_LAYER = ("seer.cli", "seer.bench")  # argument parsing and benchmark verbs, on top of the library


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_library_does_not_import_the_command_layer() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if module.startswith(COMMAND_LAYER):
            continue
        bad = sorted(n for n in _imports(path) if n.startswith(COMMAND_LAYER))
        if bad:
            offenders.append(f"{module}: {', '.join(bad)}")
    assert not offenders, "library modules import the command layer:\n" + "\n".join(offenders)


def test_only_the_command_line_imports_the_command_line() -> None:
    """The benchmark verbs share the rollout's flags through the library (seer/rollout/arguments.py), not cli/."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if not module.startswith("seer.cli") and any(n.startswith("seer.cli") for n in _imports(path)):
            offenders.append(module)
    assert not offenders, f"modules outside seer/cli import it: {offenders}"


def test_the_control_plane_imports_no_torch() -> None:
    modules = ["seer.engine.scheduler", "seer.engine.decode_reserve", "seer.engine.block_manager", "seer.engine.step",
               "seer.engine.config", "seer.engine.arguments",
               "seer.rollout.request_buffer",
               "seer.rollout.orderings", "seer.rollout.critical_path", "seer.rollout.remaining", "seer.rollout.driver",
               "seer.rollout.kv_pool", "seer.rollout.stall", "seer.rollout.virtual_time",
               "seer.rollout.step_cost", "seer.rollout.bound", "seer.rollout.config", "seer.rollout.onpolicy",
               "seer.spec.suffix_tree",
               "seer.spec.draft_server", "seer.spec.budget", "seer.spec.policy",
               "seer.sim.simulate", "seer.sim.hardware", "seer.utils.kv_size"]
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _subpackage(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_subpackages_import_each_other_one_way() -> None:
    """No circle between subpackages (seer.engine, seer.rollout, ..., deferred imports included): each layer can
    be read, tested and replaced knowing only the layers below it."""
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        here = _subpackage(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        for name in _imports(path):
            if name.startswith("seer.") and _subpackage(name) != here:
                edges.setdefault(here, set()).add(_subpackage(name))

    def path_between(start: str, goal: str, seen: set[str]) -> list[str] | None:
        if start == goal:
            return [goal]
        seen.add(start)
        for nxt in sorted(edges.get(start, ())):
            if nxt not in seen and (rest := path_between(nxt, goal, seen)) is not None:
                return [start, *rest]
        return None

    circles = [[a, *p] for a in sorted(edges) for b in sorted(edges[a])
               if (p := path_between(b, a, set())) is not None]
    assert not circles, "subpackages import each other in a circle: " + "; ".join(" -> ".join(c) for c in circles)
    assert "seer.engine" in edges.get("seer.rollout", set())  # the walk sees real imports
