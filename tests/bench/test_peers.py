"""Peer runner and helpers: clear errors, never a hang, memory and CPU accounting of a process tree."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from seer.bench.peers import hf_peer
from seer.bench.peers.proc_cpu import CpuWindow
from seer.bench.peers.proc_memory import TreeMemorySampler, tree_pids
from seer.bench.peers.runner import PeerError, run_hf_peer, run_peer_process, run_vllm_peer, vllm_python

WORKLOAD = {
    "prompts": [[1, 2, 3], [4, 5]],
    "n": 2,
    "fixed": {"max_tokens": 4, "ignore_eos": True, "temperature": 1.0},
    "sampled": {"temperature": 1.0, "max_tokens": 8},
}


def test_missing_vllm_venv_says_how_to_create_it(tmp_path: Path) -> None:
    venv = tmp_path / "no-such-venv"
    with pytest.raises(PeerError, match=r"vLLM peer venv is missing.*scripts/setup_vllm_peer\.sh"):
        run_vllm_peer(WORKLOAD, tmp_path, kv_budget_gb=1.0, timeout_s=5, venv=venv)
    with pytest.raises(PeerError, match="setup_vllm_peer"):
        vllm_python(venv)


def test_bad_arguments_are_rejected_before_starting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kv_budget_gb must be positive"):
        run_vllm_peer(WORKLOAD, tmp_path, kv_budget_gb=0, venv=tmp_path)
    with pytest.raises(ValueError, match="prompts"):
        run_hf_peer(dict(WORKLOAD, prompts=[]), tmp_path)


def test_a_hanging_peer_is_killed_at_the_timeout(tmp_path: Path) -> None:
    # The child forks a grandchild: the whole process group must go.
    script = ("import subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")
    start = time.perf_counter()
    with pytest.raises(PeerError, match="timed out after 1 s"):
        run_peer_process("sleepy", [sys.executable, "-c", script], {}, timeout_s=1.0, env=dict(os.environ),
                         log_path=tmp_path / "sleepy.log")
    assert time.perf_counter() - start < 20


def test_a_failing_peer_reports_its_log(tmp_path: Path) -> None:
    script = "import sys; print('something broke'); sys.exit(3)"
    with pytest.raises(PeerError, match=r"(?s)exit code 3.*something broke"):
        run_peer_process("broken", [sys.executable, "-c", script], {}, timeout_s=30, env=dict(os.environ),
                         log_path=tmp_path / "broken.log")


def test_a_peer_result_is_read_back(tmp_path: Path) -> None:
    script = "import json, sys; job = json.load(open(sys.argv[1])); json.dump({'echo': job}, open(sys.argv[2], 'w'))"
    log = tmp_path / "echo.log"
    result = run_peer_process("echo", [sys.executable, "-c", script], {"x": 1}, timeout_s=30, env=dict(os.environ),
                              log_path=log)
    assert result["echo"] == {"x": 1} and result["process_wall_s"] >= 0
    assert result["log_path"] == str(log) and log.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["echo.log"]  # the job/result files are cleaned up


def test_tree_memory_counts_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(200 << 20); time.sleep(30)"])
    try:
        time.sleep(1.0)
        assert child.pid in tree_pids(os.getpid())
        with TreeMemorySampler(interval_s=0.05) as sampler:
            time.sleep(0.2)
        peak = sampler.overall
        assert peak.rss_mb > 200 and 0 < peak.pss_mb <= peak.rss_mb
    finally:
        child.kill()
        child.wait()


def test_cpu_window_sees_own_work() -> None:
    window = CpuWindow(os.getpid()).start()
    start, cpu_start = time.perf_counter(), time.process_time()
    while time.process_time() - cpu_start < 0.3:  # CPU time, not wall time: the box may be busy
        pass
    use = window.stop()
    wall = time.perf_counter() - start
    assert use["own_cpu_cores"] * wall > 0.2 and use["other_cpu_cores"] >= 0


def test_hf_peer_helpers() -> None:
    ids, mask = hf_peer.left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids == [[5, 6, 7], [0, 0, 8]] and mask == [[1, 1, 1], [0, 0, 1]]
    assert hf_peer.expand([[1], [2]], 3) == [[1], [1], [1], [2], [2], [2]]
    assert hf_peer.useful_length([4, 2, 2, 2], {2}, ignore_eos=False) == 2
    assert hf_peer.useful_length([4, 2, 2, 2], {2}, ignore_eos=True) == 4
    assert hf_peer.useful_length([4, 5], {2}, ignore_eos=False) == 2
    fixed = hf_peer.generate_kwargs(WORKLOAD["fixed"])
    assert fixed["min_new_tokens"] == fixed["max_new_tokens"] == 4 and fixed["top_k"] == 0
    sampled = hf_peer.generate_kwargs(WORKLOAD["sampled"])
    assert sampled["do_sample"] and "min_new_tokens" not in sampled and sampled["top_p"] == 1.0


def _load_vllm_peer() -> ModuleType:
    path = Path(hf_peer.__file__).with_name("vllm_peer.py")
    spec = importlib.util.spec_from_file_location("seer_test_vllm_peer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports only the stdlib until run() imports vllm
    return module


def test_vllm_peer_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts its own directory on sys.path
    peer = _load_vllm_peer()
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "40")
    for key in ("VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CPU_OMP_THREADS_BIND"):
        monkeypatch.delenv(key, raising=False)
    settings = peer.apply_vllm_env({})
    assert settings["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert settings["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ  # would override the kv budget argument
    assert peer.apply_vllm_env({"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"})["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    assert peer.max_model_len(WORKLOAD, ["fixed", "sampled"]) == 3 + 8
    assert peer.max_model_len(WORKLOAD, ["fixed"]) == 3 + 4
