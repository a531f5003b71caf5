"""Load and failure behaviour: 64 concurrent clients lose nothing, a client that disconnects aborts its
responses and their KV is freed, shutting down mid-request answers pending clients with an error, /metrics."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from seer import SamplingParams
from tests.server.conftest import MODEL_NAME, check_engines_clean, make_coordinator, start_server


def test_64_concurrent_clients(server, state, reference_llm):
    prompts = [f"q{i % 16}?" for i in range(64)]  # 16 prompts, each asked by 4 separate clients

    async def one(client: httpx.AsyncClient, prompt: str) -> dict:
        r = await client.post("/v1/completions", json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 6,
                                                       "temperature": 0, "ignore_eos": True,
                                                       "return_token_ids": True})
        assert r.status_code == 200, r.text
        return r.json()

    async def main() -> list[dict]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    outs = asyncio.run(main())
    ref = {p: o.token_ids for p, o in zip(prompts[:16], reference_llm.generate(
        prompts[:16], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False))}
    assert len(outs) == 64 and len({o["id"] for o in outs}) == 64
    for p, o in zip(prompts, outs):
        assert len(o["choices"]) == 1 and o["choices"][0]["token_ids"] == ref[p]
        assert o["usage"]["completion_tokens"] == 6
    assert state.batcher.wait_idle()
    check_engines_clean(state.coordinator)


def _run_until_aborted(coordinator, state, send) -> None:
    """Start a long request with ``send`` (which gives up early), then check the rollout was cut short."""
    assert state.batcher.wait_idle()
    send()
    assert state.batcher.wait_idle(timeout=60)
    res = state.batcher.last_output.result
    assert res.stats["aborted"] == 4
    assert all(r.finish_reason == "abort" and len(r.token_ids) < 900 for r in res.responses)
    check_engines_clean(coordinator)


def test_client_disconnect_aborts_and_frees_kv(server, state):
    body = {"model": MODEL_NAME, "prompt": "a very long answer", "n": 4, "max_tokens": 900, "temperature": 1.0,
            "ignore_eos": True}

    def send() -> None:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.5))

    _run_until_aborted(state.coordinator, state, send)


def test_stream_closed_early_aborts(server, state):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def send() -> None:
        stream = client.completions.create(model=MODEL_NAME, prompt="stream then leave", n=4, max_tokens=900,
                                           stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        stream.close()

    _run_until_aborted(state.coordinator, state, send)


def test_shutdown_mid_request_answers_with_an_error(tiny_model):
    with make_coordinator(tiny_model) as coord:
        handle = start_server(coord)
        state = handle.server.config.app.state.seer
        results: dict[str, object] = {}
        body = {"model": MODEL_NAME, "prompt": "never finishes", "max_tokens": 900, "ignore_eos": True}

        def plain() -> None:
            r = httpx.post(handle.url + "/v1/completions", json=body, timeout=60)
            results["plain"] = (r.status_code, r.json())

        def streamed() -> None:
            client = openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0, timeout=60)
            try:
                for _ in client.completions.create(model=MODEL_NAME, prompt="never finishes", max_tokens=900,
                                                   stream=True, extra_body={"ignore_eos": True}):
                    pass
                results["stream"] = "completed"
            except openai.APIError as err:
                results["stream"] = err

        def queued() -> None:  # arrives while the first batch runs: waits for the next one
            try:
                r = httpx.post(handle.url + "/v1/completions", json={**body, "prompt": "later"}, timeout=60)
                results["queued"] = (r.status_code, r.json())
            except httpx.HTTPError as err:  # recorded, so a failure says what the client saw
                results["queued"] = (None, {"error": {"code": repr(err)}})

        threads = [threading.Thread(target=f) for f in (plain, streamed, queued)]
        for t in threads[:2]:
            t.start()
        deadline = time.monotonic() + 30
        while state.metrics.tokens_total == 0:  # the first batch is running
            assert time.monotonic() < deadline, "requests did not start"
            time.sleep(0.02)
        before = state.metrics.pending
        threads[2].start()
        while state.metrics.pending <= before:  # the late request waits for the next batch
            assert time.monotonic() < deadline, "the late request was not queued"
            time.sleep(0.02)
        t0 = time.monotonic()
        handle.stop()
        for t in threads:
            t.join(30)
        assert time.monotonic() - t0 < 20
        for key in ("plain", "queued"):
            status, payload = results[key]
            assert status == 503 and payload["error"]["code"] == "shutdown", payload
        assert isinstance(results["stream"], openai.APIError) and "shutting down" in str(results["stream"])
        assert state.batcher.join(30)
        check_engines_clean(coord)


def test_metrics_health_and_models(server):
    httpx.post(server.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "m", "max_tokens": 3})
    reply = httpx.get(server.url + "/metrics")
    assert reply.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(reply.text)}
    for name in ("seer_generation_tokens", "seer_tokens_per_second", "seer_instance_running",
                 "seer_queued_requests", "seer_last_rollout_tail_seconds", "seer_last_rollout_tau"):
        assert name in families, name
    assert families["seer_generation_tokens"].samples[0].name == "seer_generation_tokens_total"
    assert families["seer_generation_tokens"].samples[0].value > 0
    http = {(s.labels["path"], s.labels["code"]): s.value for s in families["seer_http_requests"].samples}
    assert http[("/v1/completions", "200")] >= 1
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    models = httpx.get(server.url + "/v1/models").json()
    assert models["data"][0]["id"] == MODEL_NAME and models["data"][0]["max_model_len"] == 1024
