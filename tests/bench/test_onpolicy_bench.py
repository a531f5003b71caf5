"""``seer bench onpolicy`` on a tiny random model: the report's shape, a pass, a broken verifier caught, bad input.

The verb's statistics are those of tests/engine/test_verify_statistics.py and tests/rollout/test_onpolicy.py
(seer/utils/stats.py); here it runs end to end through the CLI with small samples (800 per arm, ~20 s on 2 cores):
every check must pass with p > 0.001 and show that its mechanism ran (drafts accepted and rejected, responses
moved between instances, KV imported from the pool, siblings sampled on different instances). T = 0.5 makes the
tiny model's siblings agree on their first token often enough (~0.15) for the independence check to be informative.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from seer.bench.onpolicy_bench import run_onpolicy
from seer.cli.main import main
from seer.engine.sampler import RowSpec, Sampler
from seer.sampling_params import SamplingParams
from tests.models.helpers import make_tiny_model_dir

TEST_KEYS = {"statistic", "df", "pvalue", "bins", "n", "detectable_tv"}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads; on a busy 2-core machine they only add waits."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("onpolicy-bench"), family="qwen2", seed=3)


def test_the_verb_passes_and_reports_every_test(model_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "onpolicy.json"
    rc = main(["bench", "onpolicy", "--temperature", "0.5", "--top-p", "0.9", "--model", str(model_dir),
               "--samples", "800", "--json", str(out)])
    report = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert rc == 0 and report["passed"] is True, printed
    assert "PASSED" in printed and "detects total variation" in printed
    assert set(report["checks"]) == {"verify", "end_to_end", "independence"}
    assert report["setup"]["temperature"] == 0.5 and report["setup"]["samples"] == 800
    for name, check in report["checks"].items():
        assert check["passed"] and check["mechanism_ran"] and check["informative_tests"] >= 1, name
        assert 0 < check["detectable_tv"] < 0.5, (name, check["detectable_tv"])
        for t in check["tests"]:
            assert TEST_KEYS <= set(t) and t["df"] == t["bins"] - 1, (name, t)
            assert t["pvalue"] > 1e-3, (name, t)
    verify = report["checks"]["verify"]
    assert len(verify["tests"]) == 6 and all(t["n"] == 800 for t in verify["tests"])
    assert all(v > 0 for v in verify["evidence"].values()), verify["evidence"]
    e2e = report["checks"]["end_to_end"]["evidence"]
    assert e2e["speculative"]["drafted"] > 0 and e2e["speculative"]["accepted"] > 0, e2e
    roll = e2e["rollout"]
    assert roll["responses_changed_instance"] > 400 and roll["kv_imports_from_pool"] > 0, roll
    assert all(v > 0 for v in roll["kv_bytes_loaded_per_instance"].values()), roll
    assert report["checks"]["independence"]["evidence"]["cross_instance_pairs"] >= 50


def broken_choose(self: Sampler, lp: torch.Tensor, probs: torch.Tensor | None, row: RowSpec, depth: int,
                  draft: list[int], kids: list[int], forced_tok: int | None) -> tuple[int | None, int]:
    """The classic bug: each child is accepted with p(c), the bonus token drawn from p itself instead of the
    residual (p without the rejected children)."""
    assert probs is not None
    for k in kids:
        if self.rng.random() < float(probs[draft[k]]):
            return k, draft[k]
    return None, int(self._draw(probs[None], [self.rng.random()])[0])


def test_a_broken_verifier_fails(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Sampler, "_choose", broken_choose)
    report = run_onpolicy(model_dir, SamplingParams(temperature=0.5, top_p=0.9, max_tokens=4), 400, 3, 1,
                          progress=False)
    assert report["passed"] is False
    assert report["checks"]["verify"]["passed"] is False
    assert report["checks"]["verify"]["min_pvalue"] < 1e-6, report["checks"]["verify"]["min_pvalue"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--temperature", "0", "--top-p", "0.9"], "--temperature must be > 0"),
    (["--temperature", "0.7", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--temperature", "0.7", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--temperature", "0.7", "--top-p", "0.9", "--model", "/nonexistent/model-dir"], "neither a directory"),
])
def test_bad_input_is_one_line_and_status_2(flags: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "onpolicy", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and err.startswith("seer bench: error:"), err
