"""``seer <verb>``: one entry point, one module per verb.

Verbs register themselves in ``VERBS`` lazily (importing torch only when a verb needs it). Errors that are the
user's (bad path, bad value) print one clear line and exit with status 2 instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# verb -> module under seer.cli that defines ``add_parser(subparsers)``; the parser's ``func`` runs the verb.
VERBS = {
    "models": "seer.cli.models",
    "generate": "seer.cli.generate",
    "bench": "seer.cli.bench",
    "rollout": "seer.cli.rollout",
    "simulate": "seer.cli.simulate",
    "train": "seer.cli.train",
    "serve": "seer.cli.serve",
}


def build_parser() -> argparse.ArgumentParser:
    from seer import __version__

    parser = argparse.ArgumentParser(prog="seer", description="Fast synchronous RL rollouts.")
    parser.add_argument("--version", action="version", version=f"seer {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True)
    for module in VERBS.values():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
            continue  # verb not built yet
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError, KeyError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"seer {args.verb}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
