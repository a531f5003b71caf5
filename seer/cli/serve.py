"""``seer serve``: the rollout server (OpenAI-compatible, SGLang-style and batch endpoints) on one machine.

    seer serve --model smollm2-135m-instruct --instances 2 --host 127.0.0.1 --port 8000

Loopback by default; binding another address without ``--api-key`` (or ``SEER_API_KEY``) prints a warning.
The model is loaded once per instance before the port opens; Ctrl-C answers pending requests with an error
and exits. Batching: requests arriving within ``--batch-window-ms`` (or while a rollout runs) form one
rollout; ``--chunk-tokens`` (32 by default, smaller than a batch rollout's 128) sets how often streamed
tokens arrive and how soon an aborted request frees its KV.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from seer.cli.common import resolve_model
from seer.engine.arguments import add_engine_args, engine_config
from seer.rollout.backends import BACKENDS
from seer.rollout.config import RolloutConfig, default_instance_engine
from seer.server.config import DEFAULT_CHUNK_TOKENS, ServerConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve rollouts over HTTP (OpenAI / SGLang compatible)")
    add_engine_args(p, default_instance_engine())
    p.add_argument("--served-model-name", default=None, help="the name clients use (default: --model as given)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (loopback by default; use 0.0.0.0 to serve other machines)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--api-key", default=os.environ.get("SEER_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $SEER_API_KEY, else no key)")
    p.add_argument("--instances", type=int, default=1, help="engine instances behind the server")
    p.add_argument("--backend", default="inprocess", choices=list(BACKENDS),
                   help="inprocess (virtual clock per instance), local (a process each) or ray (actors)")
    p.add_argument("--policy", default="seer", help="seer (default), seer-paper, verl, divided or context")
    p.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS,
                   help="tokens per chunk (small: results stream and aborts land per chunk)")
    p.add_argument("--batch-window-ms", type=float, default=1000.0 * ServerConfig.batch_window_s,
                   help="a batch closes after this long without a new request")
    p.add_argument("--batch-max-wait-ms", type=float, default=1000.0 * ServerConfig.batch_max_wait_s,
                   help="... or this long after its first one")
    p.add_argument("--seed", type=int, default=0, help="random seed (each group and sibling derives its own from it)")
    p.add_argument("--max-body-mb", type=float, default=ServerConfig.max_body_bytes / 2**20,
                   help="largest request body accepted, MiB")
    p.add_argument("--no-spec-adaptive", action="store_true", help="fixed draft length (no verify-cost profile)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="server log level")
    p.set_defaults(func=run)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_config(args: argparse.Namespace):
    from seer.engine.speculator import SpecConfig

    engine = engine_config(args, seed=args.seed)
    spec = SpecConfig(adaptive=not args.no_spec_adaptive)
    return RolloutConfig(policy=args.policy, instances=args.instances, backend=args.backend,
                         chunk_tokens=args.chunk_tokens, engine=engine, spec=spec)


def run(args: argparse.Namespace) -> int:
    from seer.rollout.coordinator import RolloutCoordinator
    from seer.server.app import create_app
    from seer.server.config import ServerConfig
    from seer.server.serving import make_server

    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if not _loopback(args.host) and not args.api_key:
        print(f"seer serve: warning: listening on {args.host} without --api-key; anyone who can reach this "
              "address can use the server", file=sys.stderr)
    model = resolve_model(args.model)
    server_config = ServerConfig(model_name=args.served_model_name or args.model or model.name,
                                 api_key=args.api_key, batch_window_s=args.batch_window_ms / 1000.0,
                                 batch_max_wait_s=max(args.batch_max_wait_ms, args.batch_window_ms) / 1000.0,
                                 chunk_tokens=args.chunk_tokens, policy=args.policy,
                                 max_body_bytes=int(args.max_body_mb * 2**20))
    coordinator = RolloutCoordinator(model, build_config(args))
    try:
        app = create_app(coordinator, server_config)
        state = app.state.seer
        server = make_server(app, state.batcher, args.host, args.port, args.log_level)
        print(f"seer serve: {server_config.model_name} on http://{args.host}:{args.port} "
              f"({args.instances} instance(s), policy {args.policy}, backend {args.backend})", file=sys.stderr)
        try:
            server.run()
        except KeyboardInterrupt:
            pass  # uvicorn re-raises the Ctrl-C it shut down on; pending clients were answered already
        state.batcher.join(timeout=30.0)
    finally:
        coordinator.close()
    return 0
