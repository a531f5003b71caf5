"""The vllm peer of `seer bench rollout`, without vllm: jobs, the metrics row, the scheduler probe, clear errors."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from seer.bench import rollout_peer
from seer.bench.peers.runner import PeerError
from seer.bench.rollout_peer import build_jobs, instance_requests, kv_cache_bytes, peer_row, run_vllm_rollout_peer
from seer.rollout.metrics import REPORT_KEYS, compare
from seer.rollout.types import GroupInput
from seer.sampling_params import SamplingParams

# 2 layers x 2 kv heads x head_dim 16 (64 / 4 heads): K+V = 2 * 2 * 2 * 16 = 128 values a token
TINY_CONFIG = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64,
               "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "max_position_embeddings": 512, "eos_token_id": 2}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    return folder


def group(key: int, prompt_len: int, lengths: tuple[int, ...] | None, size: int = 2) -> GroupInput:
    sp = SamplingParams(temperature=1.0, max_tokens=max(lengths) if lengths else 7, ignore_eos=True)
    prompt = tuple(range(10 + key, 10 + key + prompt_len))
    return GroupInput(prompt, size if lengths is None else len(lengths), sp, key=str(key), true_lengths=lengths)


def five_groups() -> list[GroupInput]:
    return [group(g, 3 + g, (4 + g, 2)) for g in range(5)]


def test_groups_split_evenly_one_request_per_response() -> None:
    shares = instance_requests(five_groups(), 2)
    assert [sorted({r["group"] for r in s}) for s in shares] == [[0, 1, 2], [3, 4]]  # veRL's contiguous split
    first = shares[0][:2]
    assert [r["id"] for r in first] == ["0-0", "0-1"]
    assert [r["max_tokens"] for r in first] == [4, 2]  # each response runs to its own recorded length
    assert first[0]["prompt_token_ids"] == first[1]["prompt_token_ids"] == [10, 11, 12]
    assert sum(len(s) for s in shares) == 10


def test_requests_carry_their_groups_sampling_settings() -> None:
    sp = SamplingParams(temperature=0.7, top_p=0.8, top_k=20, max_tokens=5, ignore_eos=True)
    (share,) = instance_requests([GroupInput((1, 2), 2, sp, key="a", true_lengths=(5, 3))], 1)
    assert [(r["temperature"], r["top_p"], r["top_k"]) for r in share] == [(0.7, 0.8, 20)] * 2


def test_a_group_without_recorded_lengths_runs_to_max_tokens() -> None:
    (share,) = instance_requests([group(0, 3, None, size=3)], 1)
    assert [r["max_tokens"] for r in share] == [7, 7, 7]


def test_jobs_carry_the_same_kv_tokens_and_lengths(model_dir: Path) -> None:
    jobs = build_jobs(five_groups(), model_dir, instances=3, kv_tokens=160, seed=5)
    assert [j["instance"] for j in jobs] == [0, 1, 2]
    assert [len(j["requests"]) for j in jobs] == [4, 4, 2]
    for job in jobs:
        # usable tokens plus vllm's null block, K+V in bf16
        assert job["kv_tokens"] == 160 and job["kv_cache_memory_bytes"] == (160 + 32) * 128 * 2
        assert job["block_size"] == 32 and job["seed"] == 5
        assert job["max_model_len"] == (3 + 4) + (4 + 4)  # longest prompt + response of the whole workload
    json.dumps(jobs)  # the job travels as JSON


def test_kv_tokens_round_up_to_whole_peer_blocks(model_dir: Path) -> None:
    (job,) = build_jobs(five_groups(), model_dir, instances=1, kv_tokens=176, seed=0)
    assert job["kv_tokens"] == 192 and job["kv_cache_memory_bytes"] == (192 + 32) * 256


def test_an_instance_without_groups_gets_an_empty_job(model_dir: Path) -> None:
    jobs = build_jobs(five_groups()[:1], model_dir, instances=2, kv_tokens=64, seed=0)
    assert [len(j["requests"]) for j in jobs] == [2, 0]


def test_kv_bytes_follow_the_model_config(model_dir: Path) -> None:
    assert kv_cache_bytes(model_dir, 16) == 16 * 256
    assert kv_cache_bytes(model_dir, 16, "float32") == 16 * 512
    for bad in ("int8", "nope"):
        with pytest.raises(ValueError, match="unknown dtype"):
            kv_cache_bytes(model_dir, 16, bad)
    with pytest.raises(ValueError, match="kv_tokens"):
        kv_cache_bytes(model_dir, 0)


def fake_result(finish: list[float], tokens: list[int], busy_end: float, preemptions: int | None = 0,
                reprefill: int | None = 0, max_tokens: list[int] | None = None) -> dict[str, Any]:
    max_tokens = max_tokens or tokens
    responses = [{"id": f"{i}", "group": i // 2, "max_tokens": m, "finish_s": f, "tokens": t}
                 for i, (f, t, m) in enumerate(zip(finish, tokens, max_tokens))]
    return {"responses": responses, "busy_s": [0.0, busy_end], "steps": 9, "preemptions": preemptions,
            "reprefill_tokens": reprefill, "vllm_version": "0.32.0",
            "engine_settings": {"block_size": 32, "num_gpu_blocks": 20},
            "env": {}, "llm_kwargs": {}, "startup_s": 12.5, "cpus": "0", "process_wall_s": 20.0}


def test_peer_results_become_a_report_row() -> None:
    results = [fake_result([1.0, 2.0, 3.0], [10, 10, 10], 3.0, preemptions=2, reprefill=30),
               fake_result([1.0, 5.0], [10, 20], 5.0, preemptions=1, reprefill=0)]
    row = peer_row(results)
    assert all(k in row for k in REPORT_KEYS)
    assert row["makespan_s"] == 5.0 and row["generated_tokens"] == 60 and row["num_responses"] == 5
    assert row["throughput_tok_s"] == pytest.approx(60 / 5.0)
    assert row["p90_s"] == 5.0 and row["tail_s"] == 0.0  # nearest rank: 5 values, p90 is the 5th
    assert row["idle_frac"] == pytest.approx([0.4, 0.0])  # instance 0 is done at 3 s of 5
    assert row["preemptions"] == 3 and row["reprefill_tokens"] == 30 and row["kv_bytes_moved"] == 0
    assert "preemptions_unmeasured" not in row and "length_mismatches" not in row
    assert row["wall_s"] == 8.0
    assert row["peer"]["vllm_version"] == "0.32.0" and row["peer"]["startup_s"] == [12.5, 12.5]
    assert row["peer"]["usable_kv_tokens"] == [608, 608]  # 20 blocks of 32 but the null block
    verl = dict(row, throughput_tok_s=6.0, tail_s=1.0)
    report = compare({"verl": verl, "vllm": row})
    assert report["speedup_vs_verl"]["vllm"] == pytest.approx(2.0)
    assert report["tail_reduction_vs_verl"]["vllm"] == pytest.approx(1.0)


def test_the_tail_is_the_time_after_p90() -> None:
    finish = [float(i) for i in range(1, 11)]
    row = peer_row([fake_result(finish, [5] * 10, 10.5)])
    assert row["makespan_s"] == 10.0 and row["p90_s"] == 9.0 and row["tail_s"] == pytest.approx(1.0)
    assert row["idle_frac"] == [0.0]  # busy past the last finish is clipped to the makespan


def test_unmeasured_counts_and_idle_instances_are_marked() -> None:
    row = peer_row([fake_result([2.0], [4], 2.0, preemptions=None, reprefill=None, max_tokens=[6]), None])
    assert row["preemptions"] == 0 and row["preemptions_unmeasured"] is True
    assert row["reprefill_tokens"] == 0 and row["reprefill_unmeasured"] is True
    assert row["idle_frac"] == [0.0, 1.0] and row["peer"]["startup_s"] == [12.5, None]
    assert row["length_mismatches"] == 1


def test_missing_venv_is_a_clear_error(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PeerError, match=r"vLLM peer venv is missing.*setup_vllm_peer\.sh"):
        run_vllm_rollout_peer(five_groups(), model_dir, instances=2, kv_tokens=64, seed=0,
                              venv=tmp_path / "no-venv")
    from seer.cli.main import main

    monkeypatch.setenv("SEER_VLLM_VENV", str(tmp_path / "no-venv"))
    argv = ["bench", "rollout", "--trace", str(tmp_path / "unused.jsonl"), "--peer", "vllm"]
    assert main(argv) == 2  # one line, before any rollout or model load


FAKE_PEER = """
import json, sys
job = json.load(open(sys.argv[2]))
out = [{"id": r["id"], "group": r["group"], "max_tokens": r["max_tokens"], "finish_s": 0.5 * (i + 1),
        "tokens": r["max_tokens"]} for i, r in enumerate(job["requests"])]
result = {"responses": out, "busy_s": [0.0, 0.5 * len(out)], "preemptions": None, "reprefill_tokens": None,
          "startup_s": 1.0, "vllm_version": "fake", "instance": job["instance"], "core": job["core"]}
json.dump(result, open(sys.argv[3], "w"))
"""


def fake_venv(tmp_path: Path) -> Path:
    """A 'venv' whose python runs FAKE_PEER with the peer script's arguments."""
    venv = tmp_path / "fake-venv"
    (venv / "bin").mkdir(parents=True)
    (tmp_path / "fake_peer.py").write_text(FAKE_PEER)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / "fake_peer.py"}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return venv


def test_instances_run_one_after_another_through_the_runner(model_dir: Path, tmp_path: Path) -> None:
    row = run_vllm_rollout_peer(five_groups(), model_dir, instances=2, kv_tokens=64, seed=0,
                                venv=fake_venv(tmp_path), timeout_s=60, log_dir=tmp_path / "logs")
    assert row["num_responses"] == 10 and row["generated_tokens"] == sum(4 + g + 2 for g in range(5))
    assert row["makespan_s"] == 3.0  # instance 0: 6 responses at 0.5 s apart, on its own clock
    assert row["idle_frac"] == pytest.approx([0.0, 1 - 2.0 / 3.0])
    assert row["preemptions_unmeasured"] is True
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["vllm-rollout-0.log", "vllm-rollout-1.log"]


def _load_peer_script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts its own directory on sys.path
    spec = importlib.util.spec_from_file_location("seer_test_vllm_rollout_peer", rollout_peer.PEER_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports only the stdlib until run() imports vllm
    return module


def test_peer_script_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    peer = _load_peer_script(monkeypatch)
    env = peer.peer_env(3, {})
    assert env == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_OMP_THREADS_BIND": "3",
                   "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert peer.peer_env(3, {"VLLM_ENABLE_V1_MULTIPROCESSING": 1})["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert peer.pin_to_core(None) == sorted(os.sched_getaffinity(0))


class FakeScheduler:
    """Just enough of vllm's v1 scheduler for the probe: requests, a preempt and an update method."""

    def __init__(self) -> None:
        self.requests: dict[str, SimpleNamespace] = {}

    def _preempt_request(self, request: SimpleNamespace, timestamp: float) -> None:
        request.num_computed_tokens = 0

    def _update_after_schedule(self, scheduler_output: SimpleNamespace) -> None:
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            self.requests[rid].num_computed_tokens += n

    def step(self, **scheduled: int) -> None:
        self._update_after_schedule(SimpleNamespace(num_scheduled_tokens=scheduled))


def test_scheduler_probe_counts_preemptions_and_recomputed_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    peer = _load_peer_script(monkeypatch)
    sched = FakeScheduler()
    llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(
        engine_core=SimpleNamespace(scheduler=sched))))
    probe = peer.SchedulerProbe.attach(llm)
    assert probe is not None
    sched.requests = {"a": SimpleNamespace(num_computed_tokens=0), "b": SimpleNamespace(num_computed_tokens=0)}
    sched.step(a=10, b=4)       # prefills
    sched.step(a=1, b=1)        # decode: a has 11 computed, b 5
    sched._preempt_request(sched.requests["a"], 0.0)
    sched.requests["a"].num_computed_tokens = 8  # on resume, a prefix-cache hit covers 8 tokens
    sched.step(a=4)             # tokens 8..11 again: 3 recomputed (8, 9, 10), 1 new
    assert probe.preemptions == 1 and probe.reprefill_tokens == 3
    assert sched.requests["a"].num_computed_tokens == 12  # the original method still runs
    no_core = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace()))
    assert peer.SchedulerProbe.attach(no_core) is None  # engine core in another process: counts unmeasured


def test_the_summary_table_puts_policies_side_by_side() -> None:
    from seer.bench.rollout_bench import summary_table

    row = {"makespan_s": 50.0, "throughput_tok_s": 200.0, "tail_s": 10.0, "p90_s": 40.0, "preemptions": 12}
    seer = dict(row, makespan_s=40.0, throughput_tok_s=250.0, tail_s=2.0, preemptions=0, spec={"tau": 2.5})
    lines = summary_table({"verl": row, "seer": seer}, bound_s=20.0).splitlines()
    assert lines[0].split() == ["policy", "makespan", "s", "tail", "s", "tok/s", "vs", "verl", "preempt", "tau",
                                "/", "bound"]
    assert lines[2].split() == ["verl", "50.0", "10.0", "200", "1.00x", "12", "-", "2.50"]
    assert lines[3].split() == ["seer", "40.0", "2.0", "250", "1.25x", "0", "2.50", "2.00"]
    assert lines[-1] == "bound: 20.0 s (the makespan no policy can beat)"
    alone = summary_table({"seer": seer}, bound_s=None).splitlines()  # no verl, no bound: dashes, no bound line
    assert alone[2].split() == ["seer", "40.0", "2.0", "250", "-", "0", "2.50", "-"] and len(alone) == 3
