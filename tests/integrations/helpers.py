"""Shared builders for the verl-bridge tests: a tiny Seer coordinator, verl-shaped batches, a fake server."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import torch

from seer.engine.speculator import SpecConfig
from seer.integrations.verl.batching import left_pad, position_ids_from_mask
from seer.rollout.config import RolloutConfig, default_instance_engine
from seer.rollout.coordinator import RolloutCoordinator

PROMPTS = [list(range(5, 14)), list(range(20, 26)), list(range(40, 52))]


def coordinator(model_dir, engine: dict | None = None, **kw) -> RolloutCoordinator:
    """``engine``: fields of the instances' engine to change; ``kw``: fields of the rollout."""
    base = replace(default_instance_engine(), dtype="float32", block_size=4, num_kv_blocks=96)
    cfg: dict = dict(instances=2, chunk_tokens=6, policy="context", spec=SpecConfig(adaptive=False))
    cfg.update(kw)
    return RolloutCoordinator(model_dir, RolloutConfig(engine=replace(base, **(engine or {})), **cfg))


def verl_rollout_config(**kw) -> dict:
    """The fields of verl's ``actor_rollout_ref.rollout`` that the bridge reads."""
    cfg = {"name": "seer", "n": 3, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "prompt_length": 16,
           "response_length": 12, "calculate_log_probs": True,
           "val_kwargs": {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "do_sample": False, "n": 1}}
    cfg.update(kw)
    return cfg


def token_batch(prompts=PROMPTS, n: int = 3, width: int = 16, pad_id: int = 0):
    """verl's legacy generation batch: left-padded prompts, each repeated n times interleaved, with uids."""
    rows = [p for p in prompts for _ in range(n)]
    ids, mask = left_pad(rows, width, pad_id)
    uids = np.array([f"uid-{i}" for i in range(len(prompts)) for _ in range(n)], dtype=object)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask)}, {"uid": uids}


def object_array(items) -> np.ndarray:
    arr = np.empty(len(items), dtype=object)
    for i, x in enumerate(items):
        arr[i] = x
    return arr


def permute(tensors: dict, non_tensor: dict, perm: list[int]):
    idx = torch.tensor(perm)
    return ({k: v[idx] for k, v in tensors.items()}, {k: v[np.array(perm)] for k, v in non_tensor.items()})


class FakeSeerServer:
    """A stand-in for ``seer serve``'s ``/v1/rollout`` and ``/update_weights``: answers each group with
    deterministic responses (``[first prompt token, sibling index, group position]``), streams the groups in
    reverse order (as if the last group finished first) with their responses reversed too, ends with the
    ``done`` line ``seer serve`` writes, and loads pushed safetensors to check them."""

    def __init__(self, api_key: str | None = None) -> None:
        self.api_key = api_key
        self.requests: list[dict] = []
        self.loaded: list[dict] = []
        self.version = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _json(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._json(200, {"status": "ok", "weight_version": outer.version})

            def do_POST(self):
                if outer.api_key and self.headers.get("Authorization") != f"Bearer {outer.api_key}":
                    return self._json(401, {"error": {"message": "bad key", "type": "auth"}})
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body})
                if self.path == "/update_weights":
                    from pathlib import Path

                    from safetensors.torch import load_file
                    files = sorted(Path(body["path"]).glob("*.safetensors"))
                    outer.loaded.append({k: v.clone() for f in files for k, v in load_file(str(f)).items()})
                    outer.version += 1
                    return self._json(200, {"weight_version": outer.version})
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.end_headers()
                groups = body["groups"]
                for pos in reversed(range(len(groups))):
                    g = groups[pos]
                    responses = [{"index": j, "token_ids": [g["prompt_token_ids"][0], j, pos],
                                  "logprobs": [-0.1, -0.2, -0.3], "finish_reason": "length"} for j in range(g["n"])]
                    line = {"group": pos, "group_id": g["group_id"], "responses": responses[::-1],
                            "weight_version": outer.version}
                    self.wfile.write((json.dumps(line) + "\n").encode())
                    self.wfile.flush()
                done = {"done": True, "groups": len(groups), "weight_version": outer.version}
                self.wfile.write((json.dumps(done) + "\n").encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeSeerServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
