"""Every bad input gets an OpenAI-style error body with the right status: 400 for bad requests, 401 without the
API key, 404 for unknown routes, 413 for oversized bodies; the official client raises the matching errors."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import MODEL_NAME, start_server

OK = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 4}


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


@pytest.mark.parametrize("body, param, code", [
    ({**OK, "model": "gpt-4"}, "model", "model_not_found"),
    ({**OK, "n": 0}, "n", None),
    ({**OK, "n": -3}, "n", None),
    ({**OK, "n": "many"}, "n", None),
    ({**OK, "max_tokens": 5000}, "max_tokens", "context_length_exceeded"),
    ({**OK, "max_tokens": 0}, "max_tokens", None),
    ({**OK, "temperature": -1}, "temperature", None),
    ({**OK, "temperature": "hot"}, "temperature", None),
    ({**OK, "top_p": 1.5}, "top_p", None),
    ({**OK, "top_p": 0}, "top_p", None),
    ({**OK, "top_k": -5}, "top_k", None),
    ({**OK, "seed": -1}, "seed", None),
    ({**OK, "logprobs": 99}, "logprobs", None),
    ({**OK, "prompt": [1, 2, 100000]}, "prompt", "invalid_token_id"),
    ({**OK, "prompt": ""}, "prompt", None),
    ({**OK, "prompt": []}, "prompt", None),
    ({k: v for k, v in OK.items() if k != "prompt"}, "prompt", None),
    ({**OK, "presence_penalty": 0.5}, "presence_penalty", "unsupported"),
    ({**OK, "echo": True}, "echo", "unsupported"),
    ({**OK, "stop_token_ids": [-1]}, "stop_token_ids", None),
])
def test_bad_completion_requests(server, body, param, code):
    assert_openai_error(httpx.post(server.url + "/v1/completions", json=body), 400, param, code)


def test_invalid_json_and_wrong_shapes(server):
    url = server.url + "/v1/completions"
    for raw in (b"{not json", b"", b"[1, 2]", b"null", b"\xff\xfe"):
        assert_openai_error(httpx.post(url, content=raw, headers={"content-type": "application/json"}), 400)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": []}, "messages"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"content": "x"}]}, "messages.role"),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}],
                              "max_completion_tokens": 4000}, "max_completion_tokens"),
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, "model"),
    ("/generate", {"text": "a", "input_ids": [1, 2]}, "text"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 4000}}, "max_new_tokens"),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"temperature": -2}}, "temperature"),
    ("/v1/rollout", {"groups": []}, "groups"),
    ("/v1/rollout", {"groups": [{"prompt": "a", "prompt_token_ids": [1]}]}, "groups.0"),
    ("/v1/rollout", {"groups": [{"prompt": "a", "n": 0}]}, "n"),
    ("/update_weights", {}, "model_path"),
])
def test_bad_requests_on_other_endpoints(server, path, body, param):
    assert_openai_error(httpx.post(server.url + path, json=body), 400, param)


def test_unknown_route(server):
    err = assert_openai_error(httpx.get(server.url + "/v1/nothing"), 404)
    assert err["type"] == "not_found_error"
    assert_openai_error(httpx.get(server.url + "/v1/completions"), 405)


def test_openai_client_raises_bad_request(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt="hi", n=0)
    assert info.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="unknown-model", prompt="hi")


def test_api_key_and_body_limit(coordinator):
    handle = start_server(coordinator, api_key="sekret", max_body_bytes=4096)
    try:
        url = handle.url + "/v1/completions"
        err = assert_openai_error(httpx.post(url, json=OK), 401, code="invalid_api_key")
        assert err["type"] == "authentication_error"
        assert_openai_error(httpx.post(url, json=OK, headers={"Authorization": "Bearer wrong"}), 401)
        assert httpx.post(url, json=OK, headers={"Authorization": "Bearer sekret"}).status_code == 200
        assert httpx.get(handle.url + "/metrics").status_code == 401
        assert httpx.get(handle.url + "/health").status_code == 200  # open for load balancers
        bad = openai.OpenAI(base_url=handle.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
        good = openai.OpenAI(base_url=handle.url + "/v1", api_key="sekret", max_retries=0)
        assert len(good.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).choices) == 1
        key = {"Authorization": "Bearer sekret"}
        big = {**OK, "prompt": "x" * 8000}
        assert_openai_error(httpx.post(url, json=big, headers=key), 413, code="request_too_large")
        chunked = (b"x" * 1000 for _ in range(8))  # no content-length: counted while reading
        assert_openai_error(httpx.post(url, content=chunked, headers=key), 413, code="request_too_large")
    finally:
        handle.stop()
