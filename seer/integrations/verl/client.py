"""How the verl bridge reaches Seer: in this process, over HTTP to ``seer serve``, or through a Ray actor.

All three answer the same two calls, so the verl side never cares where Seer runs:

- ``rollout(groups) -> list[list[SeerResponse]]``: one call per training step with the whole batch of groups
  (context-aware scheduling sees every group at once); per group its G responses in sibling order;
- ``update_weights(state_dict_or_dir) -> int``: the synchronous weight barrier; returns the new version.

``InProcessClient`` wraps a ``RolloutCoordinator`` (tests, single-process trainers). ``HTTPClient`` speaks
``seer serve``'s ``/v1/rollout`` (NDJSON, one line per finished group, then a ``done`` line) and
``/update_weights`` (a safetensors directory: a state dict is written under ``weights_dir`` first, which the
server must be able to read).
``RayActorClient`` drives a named ``SeerRolloutActor`` that hosts a coordinator inside verl's Ray cluster, so
the driver (rollouts) and the training workers (weight pushes) reach the same Seer from different processes.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from seer.integrations.verl.batching import SeerResponse
from seer.rollout.types import GroupInput

WeightSource = Mapping[str, torch.Tensor] | str | Path


class SeerClient(Protocol):
    def rollout(self, groups: list[GroupInput]) -> list[list[SeerResponse]]: ...

    def update_weights(self, source: WeightSource) -> int: ...

    @property
    def weight_version(self) -> int | None: ...

    def close(self) -> None: ...


def _check_sizes(groups: list[GroupInput], out: list[list[SeerResponse]]) -> list[list[SeerResponse]]:
    for g, (group, responses) in enumerate(zip(groups, out)):
        if len(responses) != group.size:
            raise RuntimeError(f"Seer returned {len(responses)} responses for group {g} ({group.key}), "
                               f"expected {group.size}")
    return out


# --------------------------------------------------------------------------------------------- in process
class InProcessClient:
    """A ``RolloutCoordinator`` in this process (built from ``model`` + ``config`` or passed in)."""

    def __init__(self, coordinator=None, *, model: str | Path | None = None, config: Any = None,
                 policy: str | None = None, progress: bool = False) -> None:
        if coordinator is None:
            from seer.rollout.coordinator import RolloutCoordinator
            if model is None:
                raise ValueError("InProcessClient needs a coordinator or a model directory")
            coordinator = RolloutCoordinator(model, make_rollout_config(config))
        self.coordinator = coordinator
        self.policy = policy
        self.progress = progress
        self.last_metrics: dict[str, float] = {}

    def rollout(self, groups: list[GroupInput]) -> list[list[SeerResponse]]:
        out = self.coordinator.rollout(groups, policy=self.policy, progress=self.progress)
        by_group = out.result.groups()
        texts = {(r.group_id, r.index): t for r, t in zip(out.result.responses, out.texts)}
        result = []
        for g in range(len(groups)):
            rs = sorted(by_group.get(g, []), key=lambda r: r.index)
            result.append([SeerResponse(list(r.token_ids), list(r.logprobs), r.finish_reason, out.weight_version,
                                        texts.get((r.group_id, r.index))) for r in rs])
        m = out.metrics
        self.last_metrics = {"seer/wall_s": float(out.wall_s), "seer/weight_version": float(out.weight_version)}
        for name in ("makespan_s", "throughput_tok_s", "tail_s", "p90_s", "preemptions", "generated_tokens"):
            value = getattr(m, name, None)
            if isinstance(value, (int, float)):
                self.last_metrics[f"seer/{name}"] = float(value)
        return _check_sizes(groups, result)

    def update_weights(self, source: WeightSource) -> int:
        return int(self.coordinator.update_weights(source if isinstance(source, Mapping) else str(source)))

    @property
    def weight_version(self) -> int | None:
        return int(self.coordinator.weight_version)

    def close(self) -> None:
        self.coordinator.close()


def make_rollout_config(config: Any = None):
    """A Seer ``RolloutConfig`` from a plain mapping (verl's ``rollout.custom.seer.engine``), nested as the
    dataclass is (``{instances: 2, engine: {dtype: bfloat16}, spec: {gamma_max: 4}}``); unknown keys and wrong
    types are errors naming the key."""
    from seer.rollout.config import RolloutConfig
    from seer.utils.config_loader import from_dict

    if isinstance(config, RolloutConfig):
        return config
    return from_dict(RolloutConfig, None if config is None else dict(config), "custom.seer.engine")


# ------------------------------------------------------------------------------------------------- HTTP
def group_payload(group: GroupInput, group_id: str) -> dict:
    """One group of a ``/v1/rollout`` request."""
    p = group.params
    params = {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "max_tokens": p.max_tokens,
              "seed": p.seed, "stop_token_ids": list(p.stop_token_ids), "ignore_eos": p.ignore_eos}
    return {"prompt_token_ids": list(group.prompt_token_ids), "n": group.size, "sampling_params": params,
            "group_id": group_id}


def save_state_dict(state: Mapping[str, torch.Tensor], directory: str | Path) -> Path:
    """Write ``state`` as ``model.safetensors`` in a fresh ``directory`` (tensors copied off shared storage,
    which safetensors refuses, e.g. tied embeddings)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors, seen = {}, set()
    for k, v in state.items():
        t = v.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        tensors[k] = t.clone() if ptr in seen else t
        seen.add(ptr)
    tmp = directory / "model.safetensors.tmp"
    save_file(tensors, str(tmp))
    tmp.replace(directory / "model.safetensors")
    return directory


class HTTPClient:
    """``seer serve`` over HTTP (stdlib only: no extra dependency on the trainer side)."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 3600.0,
                 weights_dir: str | Path | None = None, keep_weights: int = 1) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = float(timeout_s)
        self.weights_dir = Path(weights_dir) if weights_dir else None
        self.keep_weights = max(1, int(keep_weights))
        self._version: int | None = None
        self._pushed: list[Path] = []
        self.last_metrics: dict[str, float] = {}

    def _request(self, path: str, body: dict | None = None, method: str | None = None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method or ("POST" if data else "GET"))
        req.add_header("Content-Type", "application/json")
        req.add_header("Accept", "application/x-ndjson, application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            return urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:2000]
            raise RuntimeError(f"Seer server {self.url}{path} answered HTTP {e.code}: {detail}") from None
        except urllib.error.URLError as e:
            raise ConnectionError(f"cannot reach the Seer server at {self.url}: {e.reason}") from None

    def rollout(self, groups: list[GroupInput]) -> list[list[SeerResponse]]:
        ids = [f"g{i}" for i in range(len(groups))]
        position = {gid: g for g, gid in enumerate(ids)}
        t0 = time.perf_counter()
        result: dict[int, list[SeerResponse]] = {}
        body = {"groups": [group_payload(g, i) for g, i in zip(groups, ids)], "return_text": False}
        with self._request("/v1/rollout", body) as resp:
            for line in _lines(resp):
                msg = json.loads(line)
                if "error" in msg:
                    err = msg["error"]
                    detail = err.get("message", err) if isinstance(err, dict) else err
                    raise RuntimeError(f"Seer rollout failed: {detail}")
                if msg.get("done"):  # closing summary line
                    if msg.get("weight_version") is not None:
                        self._version = int(msg["weight_version"])
                    continue
                gid = str(msg.get("group_id"))
                if gid not in position:
                    raise RuntimeError(f"Seer server returned unknown group id {gid!r}")
                version = msg.get("weight_version")
                responses = sorted(msg["responses"], key=lambda r: r.get("index", 0))
                result[position[gid]] = [
                    SeerResponse([int(t) for t in r["token_ids"]], [float(x) for x in (r.get("logprobs") or [])],
                                 r.get("finish_reason"), version, r.get("text")) for r in responses]
                if version is not None:
                    self._version = int(version)
        missing = [ids[g] for g in range(len(groups)) if g not in result]
        if missing:
            raise RuntimeError(f"Seer server closed the stream with {len(missing)} groups unanswered: {missing[:5]}")
        self.last_metrics = {"seer/wall_s": time.perf_counter() - t0}
        return _check_sizes(groups, [result[g] for g in range(len(groups))])

    def update_weights(self, source: WeightSource) -> int:
        if isinstance(source, Mapping):
            if self.weights_dir is None:
                raise ValueError("pushing a state dict to an HTTP Seer server needs weights_dir: a directory the "
                                 "server can read, where the weights are written as safetensors first")
            step = (self._version or 0) + 1
            directory = save_state_dict(source, self.weights_dir / f"seer-weights-{int(time.time() * 1e3)}-{step}")
            self._pushed.append(directory)
        else:
            directory = Path(source)
        with self._request("/update_weights", {"path": str(directory)}) as resp:
            body = json.loads(resp.read().decode() or "{}")
        version = body.get("weight_version", body.get("version"))
        if version is None:
            raise RuntimeError(f"Seer server answered /update_weights without a weight_version: {body}")
        self._version = int(version)
        while len(self._pushed) > self.keep_weights:  # the server has loaded them: older copies can go
            shutil.rmtree(self._pushed.pop(0), ignore_errors=True)
        return self._version

    @property
    def weight_version(self) -> int | None:
        return self._version

    def health(self) -> dict:
        with self._request("/health") as resp:
            return json.loads(resp.read().decode() or "{}")

    def close(self) -> None:
        pass


def _lines(resp) -> Iterable[str]:
    for raw in resp:
        line = raw.decode().strip() if isinstance(raw, bytes) else str(raw).strip()
        if line:
            yield line


# -------------------------------------------------------------------------------------------------- Ray
class SeerRolloutService:
    """What the Ray actor runs: a coordinator plus the two calls (kept a plain class so it is testable)."""

    def __init__(self, model: str, config: Any = None, policy: str | None = None) -> None:
        self.client = InProcessClient(model=model, config=config, policy=policy)

    def rollout(self, groups: list[GroupInput]) -> tuple[list[list[SeerResponse]], dict]:
        return self.client.rollout(groups), dict(self.client.last_metrics)

    def update_weights(self, source: WeightSource) -> int:
        return self.client.update_weights(source)

    def weight_version(self) -> int | None:
        return self.client.weight_version


class RayActorClient:
    """A named Ray actor hosting Seer: the first caller creates it, everyone else finds it by name."""

    def __init__(self, name: str = "seer_rollout", *, model: str | None = None, config: Any = None,
                 policy: str | None = None, num_gpus: float = 0, num_cpus: float = 1,
                 namespace: str | None = None) -> None:
        import ray

        self._ray = ray
        try:
            self.actor = ray.get_actor(name, namespace=namespace)
        except ValueError:
            if model is None:
                raise ValueError(f"no Ray actor named {name!r} and no model to start one with") from None
            remote = ray.remote(SeerRolloutService)
            self.actor = remote.options(name=name, namespace=namespace, get_if_exists=True, num_gpus=num_gpus,
                                        num_cpus=num_cpus, max_concurrency=1).remote(str(model), config, policy)
        self.last_metrics: dict[str, float] = {}

    def rollout(self, groups: list[GroupInput]) -> list[list[SeerResponse]]:
        out, self.last_metrics = self._ray.get(self.actor.rollout.remote(groups))
        return _check_sizes(groups, out)

    def update_weights(self, source: WeightSource) -> int:
        if isinstance(source, Mapping):
            source = {k: v.detach().to("cpu") for k, v in source.items()}
        return int(self._ray.get(self.actor.update_weights.remote(source)))

    @property
    def weight_version(self) -> int | None:
        return self._ray.get(self.actor.weight_version.remote())

    def close(self) -> None:
        pass


def make_client(options: Mapping[str, Any], model_path: str | None = None) -> SeerClient:
    """A client from verl's ``rollout.custom.seer`` options (see ``docs/verl.md``)."""
    opts = dict(options or {})
    backend = opts.get("backend", "http" if opts.get("url") else "inprocess")
    model = opts.get("model") or model_path
    if backend == "http":
        if not opts.get("url"):
            raise ValueError("Seer backend 'http' needs custom.seer.url (e.g. http://127.0.0.1:8000)")
        return HTTPClient(opts["url"], api_key=opts.get("api_key"), timeout_s=opts.get("timeout_s", 3600.0),
                          weights_dir=opts.get("weights_dir"), keep_weights=opts.get("keep_weights", 1))
    if backend == "ray":
        return RayActorClient(opts.get("actor_name", "seer_rollout"), model=model, config=opts.get("engine"),
                              policy=opts.get("policy"), num_gpus=opts.get("num_gpus", 0),
                              num_cpus=opts.get("num_cpus", 1), namespace=opts.get("namespace"))
    if backend == "inprocess":
        if model is None:
            raise ValueError("Seer backend 'inprocess' needs custom.seer.model or actor_rollout_ref.model.path")
        return InProcessClient(model=model, config=opts.get("engine"), policy=opts.get("policy"),
                               progress=bool(opts.get("progress", False)))
    raise ValueError(f"unknown Seer backend {backend!r}; choose http, ray or inprocess")
