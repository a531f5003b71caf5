"""The verl bridge on the real Seer engine (tiny random model, CPU), without verl: verl-shaped batches in,
verl's output layout out, greedy tokens identical to Seer's own API, verl's row order restored, G responses
per group, weight pushes bumping the version; and the HTTP client against a stand-in server."""

import pytest
import torch

from seer.integrations.verl.batching import group_rows, group_seed, sampling_params
from seer.integrations.verl.client import HTTPClient, InProcessClient, make_client, make_rollout_config
from seer.integrations.verl.rollout import SeerVerlRollout
from seer.rollout.types import GroupInput
from seer.sampling_params import SamplingParams
from tests.integrations.helpers import (
    PROMPTS,
    FakeSeerServer,
    coordinator,
    object_array,
    permute,
    token_batch,
    verl_rollout_config,
)

N = 3


class Recording:
    """A client that records the groups it was sent."""

    def __init__(self, inner):
        self.inner, self.sent = inner, []

    def rollout(self, groups):
        self.sent.append(list(groups))
        return self.inner.rollout(groups)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def direct(coord, groups):
    """Seer's in-process API on the same groups: per group, its responses in sibling order."""
    out = coord.rollout(groups, progress=False).result.groups()
    return [sorted(out[g], key=lambda r: r.index) for g in range(len(groups))]


def test_greedy_token_batch_equals_seer_api_in_verl_row_order(coord):
    cfg = verl_rollout_config()
    tensors, non_tensor = token_batch(n=N)
    perm = [4, 0, 8, 2, 6, 1, 7, 3, 5]                      # rows no longer grouped
    tensors, non_tensor = permute(tensors, non_tensor, perm)
    client = Recording(InProcessClient(coord))
    out, nt, meta = SeerVerlRollout(client, cfg).generate_arrays(tensors, non_tensor, {"do_sample": False})

    sent = client.sent[0]
    assert [g.size for g in sent] == [N] * len(PROMPTS)     # every prompt one Seer group of G=n
    assert all(g.params.temperature == 0.0 and g.params.max_tokens == 12 for g in sent)
    ref = direct(coord, [GroupInput(tuple(p), N, SamplingParams(temperature=0.0, max_tokens=12)) for p in PROMPTS])
    bsz = len(perm)
    assert out["responses"].shape == (bsz, 12) and out["prompts"].shape == (bsz, 16)
    assert out["input_ids"].shape == out["attention_mask"].shape == out["position_ids"].shape == (bsz, 28)
    assert out["response_mask"].shape == out["rollout_log_probs"].shape == (bsz, 12)
    assert torch.equal(out["prompts"], tensors["input_ids"])
    for row, src in enumerate(perm):
        p = src // N
        n_tok = int(out["response_mask"][row].sum())
        want = ref[p][src % N]
        assert out["responses"][row, :n_tok].tolist() == want.token_ids
        assert torch.allclose(out["rollout_log_probs"][row, :n_tok], torch.tensor(want.logprobs), atol=1e-5)
        assert nt["seer_finish_reason"][row] == want.finish_reason
    assert torch.equal(out["input_ids"][:, 16:], out["responses"])
    assert torch.equal(out["attention_mask"][:, 16:], out["response_mask"])
    assert meta["timing"]["seer/weight_version"] == 0.0 and nt["__num_turns__"].tolist() == [2] * bsz


def test_sampled_rows_map_to_their_group_and_sibling(coord):
    """Seeded sampling: siblings differ, and each row gets exactly the response of its (group, sibling)."""
    cfg = verl_rollout_config(response_length=10)
    tensors, non_tensor = token_batch(n=N)
    perm = [8, 7, 6, 5, 4, 3, 2, 1, 0]
    tensors, non_tensor = permute(tensors, non_tensor, perm)
    bridge = SeerVerlRollout(InProcessClient(coord), cfg, seed=11)
    out, _, _ = bridge.generate_arrays(tensors, non_tensor, {"global_steps": 3, "temperature": 1.0})

    rows = [[t for t in r] for r in (tensors["input_ids"][i][tensors["attention_mask"][i].bool()].tolist()
                                      for i in range(len(perm)))]
    grouping = group_rows(rows, list(non_tensor["uid"]))
    groups = [GroupInput(p, s, sampling_params(cfg, {"temperature": 1.0}, seed=group_seed(11, 3, g)))
              for g, (p, s) in enumerate(zip(grouping.prompts, grouping.sizes))]
    ref = direct(coord, groups)
    got = []
    for row, slot in enumerate(grouping.slots):
        n_tok = int(out["response_mask"][row].sum())
        got.append(out["responses"][row, :n_tok].tolist())
        assert got[-1] == ref[slot.group][slot.index].token_ids
    assert len({tuple(x) for x in got}) > len(PROMPTS), "siblings should differ when sampling"


def test_validation_padding_rows_join_their_group(coord):
    """verl pads a validation batch to a divisor of the world size by repeating leading rows (same uid)."""
    tensors, non_tensor = token_batch(n=1)
    tensors, non_tensor = permute(tensors, non_tensor, [0, 1, 2, 0])
    client = Recording(InProcessClient(coord))
    out, _, _ = SeerVerlRollout(client, verl_rollout_config()).generate_arrays(tensors, non_tensor,
                                                                               {"validate": True})
    assert [g.size for g in client.sent[0]] == [2, 1, 1]
    assert torch.equal(out["responses"][0], out["responses"][3])  # val_kwargs: greedy


def test_chat_messages_are_templated_like_verl(coord, tiny):
    from seer.models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(tiny)
    msgs = [[{"role": "user", "content": "2+3?"}], [{"role": "user", "content": "hi"}]]
    raw = object_array([m for m in msgs for _ in range(2)])
    non_tensor = {"raw_prompt": raw, "uid": object_array(["a", "a", "b", "b"])}
    cfg = verl_rollout_config(prompt_length=96, temperature=0.0)
    client = Recording(InProcessClient(coord))
    out, nt, _ = SeerVerlRollout(client, cfg, tokenizer=tok).generate_arrays(None, non_tensor, {})
    want = tok.apply_chat_template(msgs[0])
    assert client.sent[0][0].prompt_token_ids == tuple(want)
    assert out["prompts"].shape == (4, 96)
    assert out["prompts"][0, 96 - len(want):].tolist() == want and int(out["attention_mask"][0, :96].sum()) == len(want)
    assert nt["raw_prompt"][2] == msgs[1]
    with pytest.raises(NotImplementedError, match="single-turn"):
        SeerVerlRollout(client, cfg, tokenizer=tok).generate_arrays(
            None, dict(non_tensor, agent_name=object_array(["tool_agent"] * 4)), {})


def test_weight_update_bumps_version_seen_by_rollouts(tiny):
    with coordinator(tiny, instances=1) as c:
        client = InProcessClient(c)
        bridge = SeerVerlRollout(client, verl_rollout_config())
        tensors, non_tensor = token_batch(n=2)
        before, _, meta0 = bridge.generate_arrays(tensors, non_tensor, {"do_sample": False})
        state = {k: v.clone() * (1.5 if k.endswith("mlp.down_proj.weight") else 1.0)
                 for k, v in c.backend.engines[0].model.state_dict().items()}
        assert client.update_weights(state) == 1 and client.weight_version == 1
        after, _, meta1 = bridge.generate_arrays(tensors, non_tensor, {"do_sample": False})
    assert meta0["timing"]["seer/weight_version"] == 0.0 and meta1["timing"]["seer/weight_version"] == 1.0
    assert not torch.equal(before["responses"], after["responses"])


def test_http_client_groups_order_and_weight_push(tmp_path):
    with FakeSeerServer(api_key="k") as server:
        client = make_client({"backend": "http", "url": server.url, "api_key": "k", "weights_dir": str(tmp_path)})
        assert isinstance(client, HTTPClient)
        tensors, non_tensor = token_batch(n=N)
        tensors, non_tensor = permute(tensors, non_tensor, [3, 0, 6, 1, 4, 7, 2, 5, 8])
        out, _, meta = SeerVerlRollout(client, verl_rollout_config(calculate_log_probs=False)).generate_arrays(
            tensors, non_tensor, {})
        body = server.requests[0]["body"]
        assert server.requests[0]["path"] == "/v1/rollout"
        assert [g["n"] for g in body["groups"]] == [N] * 3
        assert body["groups"][0]["sampling_params"]["max_tokens"] == 12
        for row in range(9):
            first = int(tensors["input_ids"][row][tensors["attention_mask"][row].bool()][0])
            assert out["responses"][row, 0].item() == first  # each row got its own group's answer
        sib = {}
        for row in range(9):
            sib.setdefault(non_tensor["uid"][row], []).append(out["responses"][row, 1].item())
        assert all(sorted(v) == [0, 1, 2] for v in sib.values())  # every sibling exactly once
        assert "rollout_log_probs" not in out
        state = {"w": torch.ones(2, 2), "tied": torch.zeros(3)}
        state["alias"] = state["w"]  # shared storage, as tied embeddings are
        assert client.update_weights(state) == 1 and client.weight_version == 1
        assert server.requests[-1]["path"] == "/update_weights"
        assert set(server.loaded[0]) == {"w", "tied", "alias"} and torch.equal(server.loaded[0]["alias"], state["w"])
        client.update_weights(state)
        assert len(list(tmp_path.iterdir())) == 1  # older pushed copies are removed once loaded
        bad = HTTPClient(server.url, api_key="wrong")
        with pytest.raises(RuntimeError, match="HTTP 401"):
            bad.rollout([GroupInput((5, 6), 2, SamplingParams(max_tokens=3))])
        with pytest.raises(ValueError, match="weights_dir"):
            HTTPClient(server.url, api_key="k").update_weights(state)
    with pytest.raises(ConnectionError):
        HTTPClient(server.url, timeout_s=2).rollout([GroupInput((5, 6), 2, SamplingParams(max_tokens=3))])


def test_make_client_and_config_errors(tiny):
    with pytest.raises(ValueError, match="unknown Seer backend"):
        make_client({"backend": "grpc"})
    with pytest.raises(ValueError, match="needs custom.seer.url"):
        make_client({"backend": "http"})
    with pytest.raises(ValueError, match="unknown config key 'custom.seer.engine.bogus'"):
        make_rollout_config({"instances": 1, "bogus": 2})
    with pytest.raises(ValueError, match="custom.seer.engine.engine.dtype"):
        make_rollout_config({"engine": {"dtype": 16}})
    cfg = make_rollout_config({"instances": 1, "engine": {"dtype": "float32"}, "spec": {"adaptive": False}})
    assert cfg.instances == 1 and cfg.spec.adaptive is False and cfg.engine.dtype == "float32"
    assert cfg.engine.kv_cache_memory_gb == 1.0  # the rollout's default engine, only the dtype overridden


@pytest.mark.slow
def test_ray_actor_client_shares_one_seer_between_processes(tiny, coord, monkeypatch):
    """The ``ray`` backend: the manager creates a named Seer actor, a training worker finds it by name and
    pushes weights into it; rollouts through it equal the in-process ones."""
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = pytest.importorskip("ray")
    from seer.integrations.verl.client import RayActorClient

    engine = {"instances": 1, "engine": {"dtype": "float32", "block_size": 4, "num_kv_blocks": 96}, "chunk_tokens": 6,
              "policy": "context", "spec": {"adaptive": False}}
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, _node_ip_address="127.0.0.1")
    try:
        manager_side = make_client({"backend": "ray", "actor_name": "seer_test", "engine": engine}, str(tiny))
        assert isinstance(manager_side, RayActorClient)
        groups = [GroupInput(tuple(p), N, SamplingParams(temperature=0.0, max_tokens=12)) for p in PROMPTS]
        got = manager_side.rollout(groups)
        ref = direct(coord, groups)
        assert [[r.token_ids for r in g] for g in got] == [[r.token_ids for r in g] for g in ref]
        worker_side = RayActorClient("seer_test")  # found by name, no model needed
        state = {k: v.clone() * 1.5 for k, v in coord.backend.engines[0].model.state_dict().items()
                 if k.endswith("mlp.down_proj.weight")}
        full = {k: v.clone() for k, v in coord.backend.engines[0].model.state_dict().items()}
        full.update(state)
        assert worker_side.update_weights(full) == 1 and manager_side.weight_version == 1
        assert {r.weight_version for g in manager_side.rollout(groups) for r in g} == {1}
    finally:
        ray.shutdown()


def test_http_client_against_seer_serve(tiny, coord, tmp_path):
    """The real ``seer serve`` app on loopback: greedy results equal the in-process API, and a state dict pushed
    through ``weights_dir`` becomes the server's next weight version."""
    try:
        from seer.server.app import create_app
        from seer.server.config import ServerConfig
        from seer.server.serving import ServerThread
    except Exception as e:  # noqa: BLE001 - the server needs the 'serve' extra
        pytest.skip(f"seer serve is not importable here: {type(e).__name__}: {e}")
    with coordinator(tiny, instances=1) as served:
        app = create_app(served, ServerConfig(model_name="tiny", chunk_tokens=6))
        server = ServerThread(app, app.state.seer.batcher).start()
        try:
            client = make_client({"url": server.url, "weights_dir": str(tmp_path)})
            tensors, non_tensor = token_batch(n=N)
            tensors, non_tensor = permute(tensors, non_tensor, [2, 5, 8, 1, 4, 7, 0, 3, 6])
            bridge = SeerVerlRollout(client, verl_rollout_config())
            out, _, meta = bridge.generate_arrays(tensors, non_tensor, {"do_sample": False})
            ref = direct(coord, [GroupInput(tuple(p), N, SamplingParams(temperature=0.0, max_tokens=12))
                                 for p in PROMPTS])
            for row in range(len(out["responses"])):
                first = int(tensors["input_ids"][row][tensors["attention_mask"][row].bool()][0])
                p = [q[0] for q in PROMPTS].index(first)
                n_tok = int(out["response_mask"][row].sum())
                assert out["responses"][row, :n_tok].tolist() == ref[p][0].token_ids
                assert torch.allclose(out["rollout_log_probs"][row, :n_tok], torch.tensor(ref[p][0].logprobs),
                                      atol=1e-4)
            assert meta["timing"]["seer/weight_version"] == 0.0
            state = {k: v.clone() * (1.5 if k.endswith("mlp.down_proj.weight") else 1.0)
                     for k, v in served.backend.engines[0].model.state_dict().items()}
            assert client.update_weights(state) == 1 and served.weight_version == 1
            _, _, meta = bridge.generate_arrays(tensors, non_tensor, {"do_sample": False})
            assert meta["timing"]["seer/weight_version"] == 1.0
        finally:
            server.stop()
