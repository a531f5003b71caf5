"""Prompt order is a pure function of (seed, cursor); every sibling samples with its own seed."""

import json

import pytest

from seer.rl.config import DataConfig, SamplingConfig
from seer.rl.data import PromptStream, SeededGroup, load_prompts, make_groups
from seer.sampling_params import SamplingParams


class CharTok:
    def apply_chat_template(self, messages, add_generation_prompt=True):
        return [ord(c) % 100 + 1 for m in messages for c in m["content"]]


def test_stream_is_seeded_and_covers_each_epoch():
    prompts = load_prompts(DataConfig(source="synthetic", size=10), seed=0)
    a, b = PromptStream(prompts, seed=1), PromptStream(prompts, seed=1)
    first = a.take(0, 10)
    assert sorted(p.key for p in first) == sorted(p.key for p in prompts)      # an epoch is a permutation
    assert [p.key for p in a.take(7, 6)] == [p.key for p in b.take(7, 6)]       # same (seed, cursor), same data
    assert [p.key for p in a.take(7, 6)][:3] == [p.key for p in first[7:]]      # crosses into epoch 2
    assert [p.key for p in PromptStream(prompts, 2).take(0, 10)] != [p.key for p in first]
    assert [p.key for p in PromptStream(prompts, 1, shuffle=False).take(0, 3)] == [p.key for p in prompts[:3]]


def test_groups_have_distinct_sibling_seeds_per_iteration():
    data = DataConfig(source="synthetic", size=4, group_size=3, prompt_template="Q: {question}")
    prompts = load_prompts(data, seed=0)
    g1 = make_groups(prompts[:2], CharTok(), data, SamplingConfig(temperature=0.7, max_tokens=5), seed=0, iteration=1)
    g2 = make_groups(prompts[:2], CharTok(), data, SamplingConfig(temperature=0.7, max_tokens=5), seed=0, iteration=2)
    seeds = [g.response_params(i).seed for g in g1 for i in range(3)]
    assert len(set(seeds)) == 6
    assert set(seeds).isdisjoint(g.response_params(i).seed for g in g2 for i in range(3))
    assert g1[0].response_params(0).temperature == 0.7 and g1[0].size == 3
    with pytest.raises(ValueError, match="seeds for group size"):
        SeededGroup((1, 2), 2, SamplingParams(), seeds=(1,))


def test_jsonl_and_reasoning_gym_sources(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a", "question": "1+1?", "answer": "2"}) + "\n"
                    + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    prompts = load_prompts(DataConfig(source="jsonl", path=str(path)), 0)
    assert prompts[0].answer == "2" and prompts[0].metadata["data_source"] == "p" and prompts[1].messages
    path.write_text(json.dumps({"id": "a", "text": "?"}) + "\n")
    with pytest.raises(ValueError, match=r"p.jsonl:1: needs a question"):
        load_prompts(DataConfig(source="jsonl", path=str(path)), 0)
    rg = load_prompts(DataConfig(source="reasoning_gym", task="chain_sum", size=3,
                                 task_kwargs={"min_terms": 2, "max_terms": 2}), seed=5)
    assert len(rg) == 3 and rg[0].metadata["entry"]["answer"] == rg[0].answer
    with pytest.raises(ValueError, match="reasoning-gym task"):
        load_prompts(DataConfig(source="reasoning_gym", task="no_such_task"), 0)
