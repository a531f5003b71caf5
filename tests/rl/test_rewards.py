"""Rewards: math-verify, reasoning-gym, token fraction and a user function by path (verl's signature); a reward
that raises, hangs or returns garbage scores 0 with a warning and never crashes."""

import logging
import threading
import time

import pytest

from seer.rl.config import RewardConfig
from seer.rl.rewards import RewardRunner, build_scorer
from seer.rl.scorers import RewardInput, extract_final_answer


def sample(text, answer=None, token_ids=(), **meta):
    return RewardInput(text, tuple(token_ids), {"answer": answer, **meta})


def test_math_verify_gsm8k_and_boxed():
    score = build_scorer(RewardConfig(name="math_verify"))
    assert score(sample("She sold 48 + 24 = 72 clips, so the answer is \\boxed{72}.", "72")) == 1.0
    assert score(sample("The answer is \\boxed{71}.", "72")) == 0.0
    assert score(sample("So x = \\boxed{\\frac{1}{2}}", "\\frac{1}{2}")) == 1.0
    assert score(sample("It is 0.5", "\\frac{1}{2}")) == 1.0
    with pytest.raises(ValueError, match="reference 'answer'"):
        score(sample("42"))


def test_math_verify_off_the_main_thread():
    """The timeout runner calls scorers in a worker thread, where math-verify's signal timeouts cannot work."""
    runner = RewardRunner(build_scorer(RewardConfig(name="math_verify")), timeout_s=30.0)
    batch = runner.score([sample("\\boxed{72}", "72"), sample("\\boxed{7}", "72")])
    assert batch.scores == [1.0, 0.0] and batch.errors == 0


def test_reasoning_gym_chain_sum():
    import reasoning_gym

    entry = reasoning_gym.create_dataset("chain_sum", size=1, seed=3, min_terms=2, max_terms=2, min_digits=1,
                                         max_digits=1)[0]
    score = build_scorer(RewardConfig(name="reasoning_gym"))
    right, wrong = entry["answer"], str(int(entry["answer"]) + 1)
    assert score(sample(f"The result is {right}.", entry=entry)) == 1.0
    assert score(sample(f"<answer>{right}</answer> and then 99", entry=entry)) == 1.0
    assert score(sample(f"I think {wrong}", entry=entry)) == 0.0
    assert score(sample("no idea", entry=entry)) == 0.0
    assert extract_final_answer("a 1,234 b -5") == "-5" and extract_final_answer("x 1,234") == "1234"
    with pytest.raises(ValueError, match="entry"):
        score(sample("3"))


def test_token_fraction():
    class Tok:
        def token_to_id(self, t):
            return {"a": 7}.get(t)
    score = build_scorer(RewardConfig(name="token_fraction", kwargs={"token": "a"}), Tok())
    assert score(sample("", token_ids=[7, 1, 7, 2])) == 0.5
    assert score(sample("")) == 0.0
    with pytest.raises(ValueError, match="not a single token"):
        build_scorer(RewardConfig(name="token_fraction", kwargs={"token": "zz"}), Tok())
    with pytest.raises(ValueError, match="bad reward.kwargs"):
        build_scorer(RewardConfig(name="math_verify", kwargs={"nope": 1}))


def _write(tmp_path, body):
    path = tmp_path / "my_reward.py"
    path.write_text(body)
    return path


def test_user_function_with_verl_signature(tmp_path):
    path = _write(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                            "    return {'score': float(ground_truth in solution_str), 'src': data_source}\n")
    score = build_scorer(RewardConfig(name="custom", function=f"{path}:compute_score"))
    assert score(sample("it is 42", "42", data_source="gsm8k")) == 1.0
    assert score(sample("it is 41", "42")) == 0.0
    with pytest.raises(ValueError, match="has no function"):
        build_scorer(RewardConfig(name="custom", function=f"{path}:missing"))
    with pytest.raises(FileNotFoundError):
        build_scorer(RewardConfig(name="custom", function=f"{tmp_path}/none.py:f"))
    with pytest.raises(ValueError, match="path/to/file.py:function_name"):
        build_scorer(RewardConfig(name="custom", function="no_colon.py"))


def test_raising_reward_scores_zero_and_warns(tmp_path, caplog):
    path = _write(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                            "    if 'boom' in solution_str: raise RuntimeError('kaboom')\n"
                            "    if 'nan' in solution_str: return float('nan')\n"
                            "    if 'str' in solution_str: return 'high'\n"
                            "    return 1.0\n")
    runner = RewardRunner(build_scorer(RewardConfig(name="custom", function=f"{path}:compute_score")),
                          timeout_s=None, name="custom")
    with caplog.at_level(logging.WARNING, logger="seer.rl.rewards"):
        batch = runner.score([sample("ok"), sample("boom"), sample("nan"), sample("str")])
    assert batch.scores == [1.0, 0.0, 0.0, 0.0] and batch.errors == 3 and batch.timeouts == 0
    assert "RuntimeError: kaboom" in caplog.text and "nan" in caplog.text


def test_hanging_reward_times_out(caplog):
    release = threading.Event()

    def slow(s):
        if s.text == "hang":
            release.wait(10)
        return 1.0
    runner = RewardRunner(slow, timeout_s=0.2, name="slow")
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="seer.rl.rewards"):
        batch = runner.score([sample("a"), sample("hang"), sample("b")])
    release.set()
    assert time.perf_counter() - t0 < 5
    assert batch.scores == [1.0, 0.0, 1.0] and batch.timeouts == 1 and batch.errors == 0
    assert "timed out" in caplog.text


def test_many_failures_are_summarised(caplog):
    def bad(s):
        raise ValueError("x")
    with caplog.at_level(logging.WARNING, logger="seer.rl.rewards"):
        batch = RewardRunner(bad, name="bad").score([sample(str(i)) for i in range(20)])
    assert batch.errors == 20 and sum(batch.scores) == 0
    assert len(caplog.records) == 6  # five verbatim, then one count
