"""The OpenAI-compatible endpoints with the official ``openai`` client on loopback: n samples as one group,
greedy results token for token equal to the in-process API, logprobs, stop strings, usage, streaming."""

from __future__ import annotations

import openai
import pytest

from seer import SamplingParams
from tests.server.conftest import MODEL_NAME

PROMPT = "Hello there"


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def greedy(llm, prompt, max_tokens: int, n: int = 1):
    sp = SamplingParams(n=n, temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return llm.generate(prompt, sp, use_tqdm=False)[0]


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]


def test_completions_n8_greedy_equal_in_process(client, reference_llm):
    ref = greedy(reference_llm, PROMPT, 12)
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, n=8, max_tokens=12, temperature=0, logprobs=1,
                                    extra_body={"ignore_eos": True, "return_token_ids": True})
    assert len(out.choices) == 8 and sorted(c.index for c in out.choices) == list(range(8))
    for c in out.choices:
        assert c.token_ids == ref.token_ids
        assert c.text == ref.text
        assert c.finish_reason == "length"
        assert c.logprobs.token_logprobs == pytest.approx(ref.logprobs, abs=1e-4)
        assert len(c.logprobs.tokens) == 12 and len(c.logprobs.top_logprobs) == 12
    assert out.usage.completion_tokens == 8 * 12
    assert out.usage.prompt_tokens == len(reference_llm.tokenizer.encode(PROMPT))


def test_sampling_with_a_seed_is_reproducible_and_varied(client):
    kw = dict(model=MODEL_NAME, prompt=[5, 6, 7, 8, 9], n=4, max_tokens=10, temperature=1.0, seed=7,
              extra_body={"ignore_eos": True, "return_token_ids": True})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]
    assert len({tuple(c.token_ids) for c in a.choices}) > 1  # siblings sample with their own seeds


def test_several_prompts_in_one_request(client, reference_llm):
    prompts = ["abc", "xyz!"]
    out = client.completions.create(model=MODEL_NAME, prompt=prompts, n=2, max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
    texts = [c.text for c in sorted(out.choices, key=lambda c: c.index)]
    assert texts == [greedy(reference_llm, p, 6).text for p in prompts for _ in range(2)]


def test_chat_with_logprobs_equal_in_process(client, reference_llm):
    messages = [{"role": "user", "content": "What is 2+3?"}]
    ref = reference_llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
                             use_tqdm=False)[0]
    out = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=10, temperature=0,
                                         logprobs=True, top_logprobs=1, n=2, extra_body={"ignore_eos": True})
    for c in out.choices:
        assert c.message.role == "assistant" and c.message.content == ref.text
        assert [t.logprob for t in c.logprobs.content] == pytest.approx(ref.logprobs, abs=1e-4)
    assert out.usage.completion_tokens == 20


def test_stop_string_cuts_the_text(client, reference_llm):
    ref = greedy(reference_llm, PROMPT, 24)
    text = ref.text
    stop = text[6:8]
    assert stop and text.find(stop) >= 0
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True, "return_token_ids": True})
    c = out.choices[0]
    assert c.finish_reason == "stop" and c.text == text[:text.find(stop)]
    assert len(c.token_ids) < 24 and ref.token_ids[:len(c.token_ids)] == c.token_ids


def test_stop_token_ids(client, reference_llm):
    ref = greedy(reference_llm, PROMPT, 16)
    stop_id = ref.token_ids[3]
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16, temperature=0,
                                    extra_body={"stop_token_ids": [stop_id], "ignore_eos": True,
                                                "return_token_ids": True})
    c = out.choices[0]
    assert c.finish_reason == "stop" and c.token_ids == ref.token_ids[:ref.token_ids.index(stop_id) + 1]


def test_streamed_completion_equals_the_whole_one(client, reference_llm):
    ref = greedy(reference_llm, PROMPT, 20)
    stream = client.completions.create(model=MODEL_NAME, prompt=PROMPT, n=2, max_tokens=20, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    texts, reasons, chunks, usage = {0: "", 1: ""}, {}, 0, None
    for chunk in stream:
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason is not None:
                reasons[c.index] = c.finish_reason
    assert texts == {0: ref.text, 1: ref.text} and reasons == {0: "length", 1: "length"}
    assert chunks >= 2  # content (chunk-granular: up to 8 tokens per event), then usage
    assert usage is not None and usage.completion_tokens == 40


def test_streamed_chat(client, reference_llm):
    messages = [{"role": "user", "content": "Hi"}]
    ref = reference_llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
                             use_tqdm=False)[0]
    stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=12, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    text, role, reason = "", None, None
    for chunk in stream:
        for c in chunk.choices:
            role = role or c.delta.role
            text += c.delta.content or ""
            reason = c.finish_reason or reason
    assert role == "assistant" and text == ref.text and reason == "length"
