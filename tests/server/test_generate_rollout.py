"""SGLang-style ``/generate`` and the batch ``/v1/rollout`` with ``httpx``; grouping of separate requests; weight
updates between batches."""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import replace

import httpx
import pytest
from safetensors.torch import load_file, save_file

from seer import SamplingParams
from tests.server.conftest import MODEL_NAME, make_coordinator, start_server


def greedy_ids(llm, prompt, max_tokens: int) -> list[int]:
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return llm.generate(prompt, sp, use_tqdm=False)[0].token_ids


def test_generate_single_and_batch(server, reference_llm):
    ids = [10, 11, 12, 13, 14, 15]
    body = {"input_ids": ids, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 9, "temperature": 0, "ignore_eos": True}}
    r = httpx.post(server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    ref = reference_llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
                                 use_tqdm=False)[0]
    assert out["output_ids"] == ref.token_ids and out["text"] == ref.text
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 9}
    assert meta["prompt_tokens"] == 6 and meta["completion_tokens"] == 9 and meta["weight_version"] == 0
    assert [t for _, t, _ in meta["output_token_logprobs"]] == ref.token_ids
    assert [lp for lp, _, _ in meta["output_token_logprobs"]] == pytest.approx(ref.logprobs, abs=1e-4)

    body = {"text": ["ab", "cd"], "sampling_params": {"max_new_tokens": 5, "temperature": 0, "n": 3,
                                                        "ignore_eos": True}}
    out = httpx.post(server.url + "/generate", json=body, timeout=60).json()
    assert isinstance(out, list) and len(out) == 6
    assert [o["output_ids"] for o in out] == [greedy_ids(reference_llm, p, 5) for p in ("ab", "cd") for _ in range(3)]


def test_generate_stream(server, reference_llm):
    body = {"text": "stream me", "stream": True,
            "sampling_params": {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}}
    events = []
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["output_ids"] == greedy_ids(reference_llm, "stream me", 20)
    assert last["meta_info"]["finish_reason"]["type"] == "length"


def test_rollout_streams_each_group_as_it_finishes(server, reference_llm):
    groups = [{"prompt": "long one", "n": 3, "sampling_params": {"max_tokens": 40}, "group_id": "a",
               "metadata": {"answer": 5}},
              {"prompt_token_ids": [20, 21, 22, 23], "n": 2, "sampling_params": {"max_tokens": 4}},
              {"messages": [{"role": "user", "content": "hi"}], "n": 1}]
    body = {"model": MODEL_NAME, "groups": groups, "sampling_params": {"temperature": 0, "max_tokens": 8,
                                                                      "ignore_eos": True}}
    lines = []
    with httpx.stream("POST", server.url + "/v1/rollout", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    done = lines[-1]
    assert done["done"] and done["groups"] == 3 and done["responses"] == 6 and done["completion_tokens"] == 120 + 8 + 8
    by_group = {line["group"]: line for line in lines[:-1]}
    assert sorted(by_group) == [0, 1, 2]
    assert lines[0]["group"] != 0  # the 40-token group finishes last, its line comes after the short ones
    assert by_group[0]["group_id"] == "a" and by_group[0]["metadata"] == {"answer": 5}
    assert [r["token_ids"] for r in by_group[0]["responses"]] == [greedy_ids(reference_llm, "long one", 40)] * 3
    assert [r["token_ids"] for r in by_group[1]["responses"]] == [greedy_ids(reference_llm, [20, 21, 22, 23], 4)] * 2
    chat = reference_llm.chat([{"role": "user", "content": "hi"}],
                              SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
    assert by_group[2]["responses"][0]["text"] == chat.text
    assert all(r["finish_reason"] == "length" and len(r["logprobs"]) == len(r["token_ids"])
               for line in by_group.values() for r in line["responses"])


def test_separate_requests_for_one_prompt_form_one_group(server, state, reference_llm, monkeypatch):
    # a window wide enough that a loaded CI machine cannot split 8 concurrent requests by timing alone
    monkeypatch.setattr(state.batcher, "config", replace(state.batcher.config, batch_window_s=1.0,
                                                         batch_max_wait_s=5.0))

    async def send(client: httpx.AsyncClient, i: int, group_id: str | None) -> dict:
        extra = {"group_id": group_id} if group_id else {}
        r = await client.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "same prompt", "n": 1,
                                                       "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                                                       "return_token_ids": True, **extra})
        return r.json()

    async def main(group_id: str | None) -> list[dict]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(*(send(client, i, group_id) for i in range(8)))

    ref = greedy_ids(reference_llm, "same prompt", 6)
    for group_id in ("g-1", None):
        outs = asyncio.run(main(group_id))
        assert all(o["choices"][0]["token_ids"] == ref for o in outs)
        assert state.batcher.wait_idle()
        groups = state.batcher.last_output.groups
        assert [g.size for g in groups] == [8], "8 separate requests should run as one group of 8"


def test_update_weights_between_batches(tiny_model, tmp_path):
    new_dir = tmp_path / "new-weights"
    shutil.copytree(tiny_model, new_dir)
    for f in new_dir.glob("*.safetensors"):
        tensors = {k: (v * 1.5 if k.endswith("mlp.down_proj.weight") else v) for k, v in load_file(f).items()}
        save_file(tensors, f, metadata={"format": "pt"})
    with make_coordinator(tiny_model) as coord:
        handle = start_server(coord)
        try:
            body = {"model": MODEL_NAME, "prompt": "weights", "max_tokens": 12, "temperature": 0,
                    "ignore_eos": True, "return_token_ids": True}
            before = httpx.post(handle.url + "/v1/completions", json=body, timeout=60).json()
            r = httpx.post(handle.url + "/update_weights", json={"model_path": str(new_dir)}, timeout=60)
            assert r.status_code == 200 and r.json()["weight_version"] == 1
            after = httpx.post(handle.url + "/v1/completions", json=body, timeout=60).json()
            assert after["choices"][0]["token_ids"] != before["choices"][0]["token_ids"]
            gen = httpx.post(handle.url + "/generate", json={"text": "w", "sampling_params": {"max_new_tokens": 2}},
                             timeout=60).json()
            assert gen["meta_info"]["weight_version"] == 1
            assert httpx.get(handle.url + "/health").json()["weight_version"] == 1
            bad = httpx.post(handle.url + "/update_weights", json={"model_path": str(tmp_path / "nope")})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "model_path"
        finally:
            handle.stop()
