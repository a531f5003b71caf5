"""Rollout inputs: prompts files and traces become groups; bad input gets errors naming file and line."""

import gzip
import json

import pytest

from seer.models.tokenizer import Tokenizer
from seer.rollout.workload import ReplayOptions, groups_from_prompts, groups_from_trace
from seer.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return Tokenizer.from_dir(tiny_model_dir("llama", 0))


def test_prompts_file_groups(tok, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "question": "1+1?", "answer": "2"}\n\n{"prompt": "hi"}\n')
    groups = groups_from_prompts(f, tok, 4, SamplingParams(max_tokens=8))
    assert [g.size for g in groups] == [4, 4] and groups[0].metadata["answer"] == "2"


def test_every_group_of_a_prompts_file_gets_its_own_seed(tok, tmp_path):
    """Sibling seeds derive from (group seed, index): groups sharing a seed would draw the same numbers."""
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"question": f"{i}+1?"}) + "\n" for i in range(4)))
    groups = groups_from_prompts(f, tok, 3, SamplingParams(max_tokens=8, seed=5))
    seeds = [g.response_params(i).seed for g in groups for i in range(3)]
    assert len(set(seeds)) == 12 and seeds == [g.response_params(i).seed for g in
                                                groups_from_prompts(f, tok, 3, SamplingParams(max_tokens=8, seed=5))
                                                for i in range(3)]
    unseeded = groups_from_prompts(f, tok, 3, SamplingParams(max_tokens=8))
    assert all(g.params.seed is None for g in unseeded)


def test_prompt_file_errors(tok, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no prompts"):
        groups_from_prompts(empty, tok, 4, SamplingParams())
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "ok"}\n{"question": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: malformed JSON"):
        groups_from_prompts(bad, tok, 4, SamplingParams())
    with pytest.raises(ValueError, match="group size"):
        groups_from_prompts(bad, tok, 0, SamplingParams())
    with pytest.raises(FileNotFoundError):
        groups_from_prompts(tmp_path / "missing.jsonl", tok, 4, SamplingParams())


def test_length_only_trace_scaled(tmp_path):
    f = tmp_path / "t.jsonl.gz"
    with gzip.open(f, "wt") as out:
        out.write(json.dumps({"group_id": "g", "prompt_len": 40, "output_lens": [100, 300, 50]}) + "\n")
    [g] = groups_from_trace(f, 128, ReplayOptions(length_scale=0.5, max_len=120))
    assert g.stop_lengths == (50, 120, 25) and g.params.max_tokens == 120 and len(g.prompt_token_ids) == 20
    assert g.forced is None and g.response_params(1).ignore_eos


def test_token_trace_folds_ids_into_vocab():
    groups = groups_from_trace("data/math_cot_groups.jsonl", 1000, ReplayOptions(length_scale=0.1, limit=2))
    assert all(t < 1000 for g in groups for r in g.forced for t in r)
    assert all(len(r) == n for g in groups for r, n in zip(g.forced, g.true_lengths))


def test_trace_groups_share_one_max_tokens(tmp_path):
    """The run's one budget is the trace's generation limit (next power of two above its longest response), never
    a group's or a sample's own longest response: that would hand the scheduler the lengths."""
    f = tmp_path / "t.jsonl"
    with open(f, "w") as out:
        out.write(json.dumps({"group_id": "a", "prompt_len": 8, "output_lens": [10, 30]}) + "\n")
        out.write(json.dumps({"group_id": "b", "prompt_len": 8, "output_lens": [200, 90]}) + "\n")
    a, b = groups_from_trace(f, 128, ReplayOptions())
    assert a.params.max_tokens == b.params.max_tokens == 256
    assert a.stop_lengths == (10, 30) and a.response_params(1).max_tokens == 256
    [only_a] = groups_from_trace(f, 128, ReplayOptions(sample=1, seed=1))  # a sample keeps the whole trace's limit
    assert only_a.key == "a" and only_a.params.max_tokens == 256
    a, b = groups_from_trace(f, 128, ReplayOptions(length_scale=0.5))
    assert a.params.max_tokens == 128 and b.stop_lengths == (100, 45)
    a, b = groups_from_trace(f, 128, ReplayOptions(max_len=150))
    assert a.params.max_tokens == b.params.max_tokens == 150 and b.stop_lengths == (150, 90)
    a, b = groups_from_trace(f, 128, ReplayOptions(max_tokens=64))  # responses recorded longer are cut
    assert a.params.max_tokens == 64 and b.stop_lengths == (64, 64) and b.true_lengths == (64, 64)


def test_trace_declares_its_generation_limit(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"group_id": "a", "prompt_len": 8, "output_lens": [10, 30], "max_tokens": 40}) + "\n")
    [a] = groups_from_trace(f, 128, ReplayOptions())
    assert a.params.max_tokens == 40


def test_trace_groups_are_seeded_by_the_run_seed():
    """Length-only replay samples its tokens: every policy of a run must sample the same ones."""
    first = groups_from_trace("data/castillo_sample.jsonl.gz", 1000, ReplayOptions(limit=3, seed=4))
    again = groups_from_trace("data/castillo_sample.jsonl.gz", 1000, ReplayOptions(limit=3, seed=4))
    seeds = [g.response_params(i).seed for g in first for i in range(g.size)]
    assert None not in seeds and len(set(seeds)) == len(seeds)
    assert seeds == [g.response_params(i).seed for g in again for i in range(g.size)]


def test_length_only_groups_sample_with_their_recorded_settings(tmp_path):
    f = tmp_path / "t.jsonl"
    rec = {"group_id": "a", "prompt_len": 8, "output_lens": [10, 30], "temperature": 0.7, "top_p": 0.8, "top_k": 20}
    plain = {"group_id": "b", "prompt_len": 8, "output_lens": [5, 6]}
    f.write_text(json.dumps(rec) + "\n" + json.dumps(plain) + "\n")
    a, b = groups_from_trace(f, 128, ReplayOptions())
    assert (a.params.temperature, a.params.top_p, a.params.top_k) == (0.7, 0.8, 20)
    assert (b.params.temperature, b.params.top_p, b.params.top_k) == (1.0, 1.0, -1)
    a, _ = groups_from_trace(f, 128, ReplayOptions(temperature=0.5))  # an explicit temperature overrides all
    assert (a.params.temperature, a.params.top_p, a.params.top_k) == (0.5, 1.0, -1)
    f.write_text(json.dumps({**rec, "top_p": 2.0}) + "\n")
    with pytest.raises(ValueError, match="trace group 'a'.*top_p"):
        groups_from_trace(f, 128, ReplayOptions())
