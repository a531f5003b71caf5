"""Replaying a measured rollout in the simulator: a run priced by engine prices replays to the same makespan, and
a ``seer bench rollout`` report replays through ``seer simulate --replay`` with its figures beside the measured."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from seer.cli.main import main
from seer.engine.config import EngineConfig
from seer.models.config import ModelConfig
from seer.rollout.backends.inprocess import InProcessBackend
from seer.rollout.config import RolloutConfig
from seer.rollout.instances.engine import EngineInstance
from seer.rollout.kv_pool import LocalKVPool
from seer.rollout.policies import get_policy
from seer.rollout.step_cost import LinearStepCost
from seer.sim.backend import SimBackend
from seer.sim.engine_prices import EnginePrices, FittedCost
from seer.sim.replay import (
    COMPARED,
    SampleReplay,
    load_report,
    profile_from_fit,
    replay,
    sampled_tokens,
    tokens_path,
)
from tests.bench.helpers import write_token_trace
from tests.conftest import TinyModelDir
from tests.sim.test_engine_parity import VOCAB, trace

FIT = LinearStepCost(2e-3, 3e-4, 1e-4, 2e-7)
PROFILE = profile_from_fit(FIT)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: TinyModelDir) -> Path:
    return tiny_model_dir("qwen2", 5, vocab_size=VOCAB)


class PricedInProcess(InProcessBackend):
    """The in-process engine backend, every instance priced by one cost model and drafting by a fixed profile."""

    def __init__(self, model: str, config: RolloutConfig, cost: FittedCost) -> None:
        super().__init__(model, config, LocalKVPool(1 << 28))
        self.cost = cost

    def _measure_cost(self):  # noqa: ANN202
        return PROFILE

    def _prepare(self, policy):  # noqa: ANN001, ANN202
        instances, server = super()._prepare(policy)
        for inst in instances:
            assert isinstance(inst, EngineInstance)
            inst.cost_model = self.cost
        return instances, server


@pytest.mark.parametrize("policy", ["verl", "seer", "oracle+critical"])
def test_a_run_priced_by_engine_prices_replays_to_the_same_makespan(tiny: Path, policy: str) -> None:
    engine = EngineConfig(dtype="float32", block_size=4, num_kv_blocks=36, max_num_seqs=6, max_num_batched_tokens=32,
                          num_threads=1, seed=7)
    config = RolloutConfig(instances=2, chunk_tokens=8, engine=engine)
    kv_bytes = ModelConfig.from_dir(tiny).kv_bytes_per_token(torch.float32)
    cost = FittedCost(EnginePrices(FIT, kv_bytes, kv_s_per_byte=1e-9, draft_s_per_request=2e-4))
    groups = trace()
    pol = get_policy(policy)

    real = PricedInProcess(str(tiny), config, cost)
    real.rollouts = 1  # the driver's seed follows the rollout's index; the replay must follow it too
    measured = real.run(pol, groups, config.chunk_tokens, False, None)
    sim = SimBackend(config, cost, PROFILE, max_model_len=real.engines[0].max_model_len,
                     eos_token_ids=real.engines[0].eos_token_ids, check=True)
    sim.rollouts = 1
    replayed = sim.run(pol, groups, config.chunk_tokens, False, None)

    assert replayed.decisions == measured.decisions
    assert replayed.metrics.makespan_s == pytest.approx(measured.metrics.makespan_s, rel=1e-12)
    assert replayed.metrics.tail_s == pytest.approx(measured.metrics.tail_s, rel=1e-12)
    assert replayed.metrics.kv_s == pytest.approx(measured.metrics.kv_s)
    assert replayed.metrics.steps == measured.metrics.steps > 20
    assert [r.token_ids for r in replayed.responses] == [r.token_ids for r in measured.responses]
    if pol.divided:
        assert sum(replayed.metrics.kv_s) > 0 and replayed.metrics.kv_bytes_moved == measured.metrics.kv_bytes_moved
    if pol.speculative:
        assert replayed.stats["spec"]["accepted"] == measured.stats["spec"]["accepted"] > 0


def test_a_bench_report_replays_beside_its_measurements(tiny_model_dir: TinyModelDir, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("SEER_CACHE", str(tmp_path / "cache"))
    model = tiny_model_dir("qwen2", 3)
    path = write_token_trace(tmp_path / "trace.jsonl", 4, 20)
    report = tmp_path / "report.json"
    assert main(["bench", "rollout", "--model", str(model), "--trace", str(path), "--policies", "verl,seer",
                 "--instances", "2", "--dtype", "float32", "--threads", "1", "--chunk-tokens", "8",
                 "--kv-fraction", "1.0", "--json", str(report)]) == 0
    doc = json.loads(report.read_text())
    assert set(doc["replay"]) == {"args", "engine", "profile"} and doc["policies"]["verl"]["steps"] > 0
    capsys.readouterr()

    out_path = tmp_path / "replay.json"
    assert main(["simulate", "--replay", str(report), "--json", str(out_path), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "verl" in printed and re.search(r"\d/2 pairs within 10% on makespan and 15% on tail", printed)
    out = json.loads(out_path.read_text())
    (sample,) = out["samples"]
    assert list(sample["policies"]) == ["verl", "seer"] and sample["tokens"] == {"verl": "trace", "seer": "trace"}
    for name in ("verl", "seer"):
        sim, measured = sample["policies"][name], sample["measured"][name]
        assert sim["num_responses"] == 32
        assert all(measured[k] is not None for k in COMPARED)
        assert sample["error"][name]["makespan_s"] == pytest.approx(sim["makespan_s"] / measured["makespan_s"] - 1)
    assert out["summary"]["pairs"] == 2

    only = replay(report, ["oracle"])  # a policy the run did not measure: simulated, nothing to compare
    assert list(only["samples"][0]["policies"]) == ["oracle"] and only["samples"][0]["error"] == {}


def test_a_length_only_run_replays_with_the_tokens_each_policy_sampled(tiny_model_dir: TinyModelDir,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEER_CACHE", str(tmp_path / "cache"))
    model = tiny_model_dir("qwen2", 3)
    path = tmp_path / "lengths.jsonl"
    path.write_text("".join(json.dumps({"group_id": f"g{i}", "prompt_len": 6 + i,
                                        "output_lens": [5 + (3 * i + j) % 17 for j in range(4)]}) + "\n"
                            for i in range(4)))
    report = tmp_path / "report.json"
    assert main(["bench", "rollout", "--model", str(model), "--trace", str(path), "--policies", "verl,seer",
                 "--instances", "2", "--dtype", "float32", "--threads", "1", "--chunk-tokens", "8",
                 "--kv-fraction", "1.0", "--temperature", "0", "--json", str(report)]) == 0
    kept = sampled_tokens(report)
    assert set(kept) == {(0, "verl"), (0, "seer")}
    assert [len(t) for t in kept[(0, "verl")]] == [5 + (3 * i + j) % 17 for i in range(4) for j in range(4)]

    out = replay(report)
    (sample,) = out["samples"]
    assert sample["tokens"] == {"verl": "sampled", "seer": "sampled"}
    rep = SampleReplay(json.loads(report.read_text()), {}, tokens=kept)
    assert [list(f) for g in rep.groups("seer") for f in g.forced or ()] == kept[(0, "seer")]

    tokens_path(report).unlink()  # without them: random tokens, and the replay says so
    assert replay(report)["samples"][0]["tokens"] == {"verl": "random", "seer": "random"}


def test_replay_refuses_what_it_cannot_replay(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="report not found"):
        load_report(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"x": 1}')
    with pytest.raises(ValueError, match="not a `seer bench rollout` report"):
        load_report(bad)
    bad.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        load_report(bad)
    bad.write_text(json.dumps({"setup": {"trace": "t.jsonl", "groups": 2}, "policies": {}}))
    with pytest.raises(ValueError, match="does not record which groups it ran"):
        replay(bad)
    with pytest.raises(ValueError, match="no step fit"):
        EnginePrices.from_report({"policies": {}}, 100)
    import gzip
    with gzip.open(tokens_path(bad), "wt") as f:
        f.write('{"seed": 0, "policy": "verl", "tokens": [[1, 2]]}\n{"seed": 0}\n')
    with pytest.raises(ValueError, match=r"bad.tokens.jsonl.gz:2: malformed token record"):
        sampled_tokens(bad)
