"""The verl bridge against verl's own classes: DataProto in and out as the trainer uses it, the rollout
registry, the BaseRollout adapter built from verl's config dataclasses, verl's GRPO advantage on the output.

Skipped, with the reason, when verl does not import (it is an optional extra; see docs/verl.md)."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.integrations.helpers import PROMPTS, coordinator, object_array, token_batch, verl_rollout_config


def _import_verl():
    try:
        import verl  # noqa: F401
        from verl import DataProto
    except Exception as e:  # noqa: BLE001 - ImportError, or a GPU-only dependency failing at import
        pytest.skip(f"verl does not import here ({type(e).__name__}: {e}); install the 'verl' extra",
                    allow_module_level=True)
    return DataProto


DataProto = _import_verl()

from seer.integrations.verl.client import InProcessClient  # noqa: E402
from seer.integrations.verl.manager import SeerAgentLoopManager  # noqa: E402
from seer.rollout.types import GroupInput  # noqa: E402
from seer.sampling_params import SamplingParams  # noqa: E402

N = 3


def trainer_config(tiny, **rollout):
    """The slice of verl's trainer config the manager reads, as OmegaConf (as verl passes it)."""
    from omegaconf import OmegaConf

    return OmegaConf.create({
        "actor_rollout_ref": {"model": {"path": str(tiny), "custom_chat_template": None},
                              "rollout": {**verl_rollout_config(prompt_length=96), **rollout,
                                          "checkpoint_engine": {"backend": "naive"},
                                          "custom": {"seer": {"backend": "inprocess", "seed": 3}}}},
        "data": {"apply_chat_template_kwargs": {}},
        "reward_model": {"enable": False},
    })


def trainer_batch(messages: list, n: int):
    """What verl's trainer hands the manager: dataset rows with uids, repeated n times interleaved."""
    batch = DataProto.from_single_dict({"raw_prompt": object_array(messages),
                                        "dummy_tensor": torch.zeros(len(messages), 1, dtype=torch.uint8)})
    batch.non_tensor_batch["uid"] = np.array([f"u{i}" for i in range(len(messages))], dtype=object)
    batch.meta_info["temperature"] = 1.0
    gen = batch.pop(batch_keys=[], non_tensor_batch_keys=["raw_prompt"])
    gen.non_tensor_batch.update(batch.non_tensor_batch)
    gen.meta_info["global_steps"] = 1
    return batch, gen.repeat(repeat_times=n, interleave=True)


def test_seer_is_registered_in_verl_registries():
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry

    import seer.integrations.verl as seer_verl
    from seer.integrations.verl.adapter import SeerServerAdapter

    assert seer_verl.register()
    assert get_rollout_class("seer", "async") is SeerServerAdapter
    replica_cls = RolloutReplicaRegistry.get("seer")
    assert issubclass(replica_cls, RolloutReplica)


def test_env_var_registers_seer_in_a_fresh_verl_process():
    """What every verl process (driver, Ray workers) does with VERL_USE_EXTERNAL_MODULES set."""
    code = ("import verl\n"
            "from verl.workers.rollout.base import get_rollout_class\n"
            "from verl.workers.rollout.replica import get_rollout_replica_class\n"
            "print(get_rollout_class('seer').__name__, get_rollout_replica_class('seer').__name__)\n")
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="seer.integrations.verl")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["SeerServerAdapter", "SeerReplica"]


def test_replica_records_where_seer_runs_and_insists_on_seer_manager(tiny):
    from omegaconf import OmegaConf
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    import seer.integrations.verl as seer_verl

    seer_verl.register()
    cls = RolloutReplicaRegistry.get("seer")
    cfg = OmegaConf.create({"name": "seer", "tensor_model_parallel_size": 1,
                            "agent": {"agent_loop_manager_class": seer_verl.MANAGER_FQN},
                            "custom": {"seer": {"backend": "http", "url": "http://127.0.0.1:9"}}})
    rollout_cfg, _ = _verl_configs(tiny, cfg)
    replica = cls(replica_rank=0, config=rollout_cfg, model_config=None, gpus_per_node=1)

    class Group:  # the slice of RayWorkerGroup that init_hybrid reads
        workers = ["w0"]

    asyncio.run(replica.init_hybrid(Group()))
    assert replica.server_address == "http://127.0.0.1:9" and replica.workers == ["w0"]
    for call in (replica.sleep(), replica.wake_up(), replica.abort_all_requests(), replica.clear_kv_cache()):
        asyncio.run(call)
    bad = OmegaConf.merge(cfg, {"agent": {"agent_loop_manager_class": None}})
    other = cls(replica_rank=0, config=_verl_configs(tiny, bad)[0], model_config=None, gpus_per_node=1)
    with pytest.raises(ValueError, match="agent_loop_manager_class"):
        asyncio.run(other.init_hybrid(Group()))


def test_manager_serves_the_trainer_batch_and_grpo_consumes_it(coord, tiny):
    from seer.models.tokenizer import Tokenizer

    msgs = [[{"role": "user", "content": c}] for c in ("2+3?", "hi", "name a colour")]
    batch, gen = trainer_batch(msgs, N)
    manager = SeerAgentLoopManager(trainer_config(tiny), client=InProcessClient(coord),
                                   tokenizer=Tokenizer.from_dir(tiny))
    out = manager.generate_sequences(gen)
    assert isinstance(out, DataProto) and len(out) == len(msgs) * N
    for key, width in (("prompts", 96), ("responses", 12), ("response_mask", 12), ("input_ids", 108),
                       ("attention_mask", 108), ("position_ids", 108), ("rollout_log_probs", 12)):
        assert tuple(out.batch[key].shape) == (len(msgs) * N, width), key
    assert isinstance(out.meta_info["timing"], dict)
    out.meta_info.pop("timing")

    # the trainer's next moves: repeat the dataset batch the same way and union with the rollout output
    full = batch.repeat(repeat_times=N, interleave=True).union(out)
    assert list(full.non_tensor_batch["uid"]) == [f"u{i}" for i in range(len(msgs)) for _ in range(N)]
    response_mask = full.batch["attention_mask"][:, -full.batch["responses"].shape[1]:]
    assert torch.equal(response_mask, full.batch["response_mask"])
    parts = full.chunk(3)
    assert len(DataProto.concat(parts)) == len(full)

    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rewards = torch.zeros_like(full.batch["rollout_log_probs"])
    lengths = full.batch["response_mask"].sum(-1)
    rewards[torch.arange(len(full)), (lengths - 1).clamp(min=0)] = torch.arange(len(full), dtype=torch.float32)
    adv, _ = compute_grpo_outcome_advantage(rewards, full.batch["response_mask"], full.non_tensor_batch["uid"])
    assert adv.shape == rewards.shape and torch.isfinite(adv).all()


def test_token_form_dataproto_greedy_equals_seer_api(coord, tiny):
    tensors, non_tensor = token_batch(n=N)
    data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensor, meta_info={"do_sample": False})
    manager = SeerAgentLoopManager(trainer_config(tiny, prompt_length=16), client=InProcessClient(coord),
                                   tokenizer=None)
    out = manager.generate_sequences(data)
    ref = coord.rollout([GroupInput(tuple(p), N, SamplingParams(temperature=0.0, max_tokens=12)) for p in PROMPTS],
                        progress=False).result.groups()
    for row in range(len(out)):
        n_tok = int(out.batch["response_mask"][row].sum())
        assert out.batch["responses"][row, :n_tok].tolist() == ref[row // N][row % N].token_ids
    assert torch.equal(out.batch["prompts"], tensors["input_ids"])


def _verl_configs(tiny, rollout=None):
    """verl's own RolloutConfig / HFModelConfig dataclasses, built the way verl's workers build them."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig, RolloutConfig

    if rollout is None:
        rollout = OmegaConf.create({"name": "seer", "tensor_model_parallel_size": 1, "response_length": 12,
                                    "prompt_length": 16, "custom": {"seer": {"backend": "inprocess", "seed": 1}}})
    try:
        rollout_cfg = omega_conf_to_dataclass(rollout, dataclass_type=RolloutConfig)
        model_cfg = HFModelConfig(path=str(tiny))
    except Exception as e:  # noqa: BLE001 - e.g. HFModelConfig needing a GPU-only package at build time
        pytest.skip(f"verl's RolloutConfig/HFModelConfig cannot be built here: {type(e).__name__}: {e}")
    return rollout_cfg, model_cfg


def test_adapter_is_a_verl_base_rollout_and_pushes_weights(tiny):
    from verl.workers.rollout.base import BaseRollout, get_rollout_class

    rollout_cfg, model_cfg = _verl_configs(tiny)
    with coordinator(tiny, instances=1) as c:
        cls = get_rollout_class(rollout_cfg.name, "async")
        adapter = cls(rollout_cfg, model_cfg, None, client=InProcessClient(c))
        assert isinstance(adapter, BaseRollout) and adapter.options["seed"] == 1
        tensors, non_tensor = token_batch(n=2)
        data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensor, meta_info={"do_sample": False})
        before = adapter.generate_sequences(data)

        state = {k: v.clone() for k, v in c.backend.engines[0].model.state_dict().items()}

        def weights():  # what verl's workers pass: a generator of (HF name, full tensor)
            for k, v in state.items():
                yield k, v * (1.5 if k.endswith("mlp.down_proj.weight") else 1.0)

        async def sync():
            await adapter.resume(tags=["weights"])
            version = await adapter.update_weights(weights(), peft_config=None, base_sync_done=True)
            await adapter.resume(tags=["kv_cache"])
            return version

        assert asyncio.run(sync()) == 1 and c.weight_version == 1
        after = adapter.generate_sequences(data)
        assert after.meta_info["timing"]["seer/weight_version"] == 1.0
        assert not torch.equal(before.batch["responses"], after.batch["responses"])
        with pytest.raises(NotImplementedError, match="LoRA"):
            asyncio.run(adapter.update_weights(weights(), peft_config={"r": 8}))


class InlineRewardWorker:
    """verl's reward-loop worker contract (``compute_score_batch.remote(DataProto) -> list[dict]``) run
    inline with verl's own NaiveRewardManager: the score is whether the response has an even number of tokens
    plus the ground truth, so the test knows each row's expected score."""

    def __init__(self, tokenizer):
        try:
            from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
        except Exception as e:  # noqa: BLE001 - verl's reward loop needs aiohttp and more
            pytest.skip(f"verl's reward loop does not import here: {type(e).__name__}: {e}")

        def score(data_source, solution_str, ground_truth, extra_info=None, **kw):
            return {"score": float(ground_truth), "n_chars": len(solution_str)}

        self.manager = NaiveRewardManager(None, tokenizer, score)
        self.calls = 0
        worker = self

        class _Remote:
            def remote(self, data):
                worker.calls += 1
                return [worker.manager.loop.run_until_complete(worker.manager.run_single(data[i:i + 1]))
                        for i in range(len(data))]

        self.compute_score_batch = _Remote()


def test_manager_created_like_verl_09_scores_with_reward_workers(coord, tiny):
    from seer.models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(tiny)
    msgs = [[{"role": "user", "content": c}] for c in ("2+3?", "hi", "name a colour")]
    batch, gen = trainer_batch(msgs, N)
    truth = np.array([{"ground_truth": str(i)} for i in range(len(msgs))], dtype=object)
    gen.non_tensor_batch["reward_model"] = np.repeat(truth, N)
    gen.non_tensor_batch["data_source"] = np.array(["toy"] * len(gen), dtype=object)
    workers = [InlineRewardWorker(tok), InlineRewardWorker(tok)]
    manager = SeerAgentLoopManager.create(config=trainer_config(tiny), llm_client=None, teacher_client=None,
                                          reward_loop_worker_handles=workers, client=InProcessClient(coord),
                                          tokenizer=tok)
    out = manager.generate_sequences(gen)
    assert all(w.calls == 1 for w in workers)
    rm = out.batch["rm_scores"]
    last = out.batch["response_mask"].sum(-1) - 1
    for row in range(len(out)):
        assert rm[row, last[row]].item() == float(row // N) and rm[row].abs().sum().item() == float(row // N)
    assert out.meta_info["reward_extra_keys"] == ["score", "n_chars"]
    assert len(out.non_tensor_batch["n_chars"]) == len(out)
    from verl.trainer.ppo.reward import extract_reward

    out.meta_info.pop("timing")
    full = batch.repeat(repeat_times=N, interleave=True).union(out)
    reward, extras = extract_reward(full)
    assert torch.equal(reward, rm) and set(extras) == {"score", "n_chars"}
    with pytest.raises(NotImplementedError, match="distillation"):
        SeerAgentLoopManager.create(config=trainer_config(tiny), llm_client=None, teacher_client={"t": 1},
                                    client=InProcessClient(coord), tokenizer=tok)


def test_remax_greedy_baseline_rows_are_their_own_group(coord, tiny):
    """verl 0.9's REMAX concatenates the sampled rows with one greedy row per prompt, same uid."""
    from seer.models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(tiny)
    msgs = [[{"role": "user", "content": c}] for c in ("2+3?", "hi")]
    _, gen = trainer_batch(msgs, N)
    gen.non_tensor_batch["__do_sample__"] = np.ones(len(gen), dtype=bool)
    _, base = trainer_batch(msgs, 1)
    base.non_tensor_batch["__do_sample__"] = np.zeros(len(base), dtype=bool)
    combined = DataProto.concat([gen, base])

    class Spy(InProcessClient):
        def rollout(self, groups):
            self.sent = groups
            return super().rollout(groups)

    spy = Spy(coord)
    out = SeerAgentLoopManager(trainer_config(tiny), client=spy, tokenizer=tok).generate_sequences(combined)
    assert [g.size for g in spy.sent] == [N, N, 1, 1]
    assert [g.params.temperature for g in spy.sent] == [1.0, 1.0, 0.0, 0.0]
    assert len(out) == len(combined) and out.non_tensor_batch["__do_sample__"].tolist() == [True] * 6 + [False] * 2


CONFIG = Path(__file__).resolve().parents[2] / "configs" / "verl" / "seer_grpo.yaml"
NEW_KEYS = ("actor_rollout_ref.rollout.custom", "actor_rollout_ref.rollout.agent.agent_loop_manager_class",
            "ray_kwargs.ray_init.runtime_env.env_vars")


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix


def test_example_config_matches_verls_own_config(tiny):
    """Every key of configs/verl/seer_grpo.yaml exists in verl's generated trainer config (or is one of the
    extension fields verl's dataclasses accept), verl's RolloutConfig accepts the rollout section, and the
    manager builds from the merged config."""
    import importlib.resources

    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import RolloutConfig

    base_path = importlib.resources.files("verl.trainer.config") / "_generated_ppo_trainer.yaml"
    if not base_path.is_file():
        pytest.skip("this verl has no generated trainer config")
    base = OmegaConf.load(str(base_path))
    ours = OmegaConf.to_container(OmegaConf.load(CONFIG))
    ours.pop("hydra")
    ours.pop("defaults")
    base_keys = set(_leaves(OmegaConf.to_container(base)))
    unknown = [k for k in _leaves(ours) if k not in base_keys and not k.startswith(NEW_KEYS)]
    assert not unknown, f"keys verl does not know: {unknown}"

    cfg = OmegaConf.merge(base, ours, {"actor_rollout_ref": {"model": {"path": str(tiny)}}})
    OmegaConf.resolve(cfg)  # as verl's entry point does before building its dataclasses
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout, dataclass_type=RolloutConfig)
    assert rollout.name == "seer" and rollout.agent.agent_loop_manager_class.endswith("SeerAgentLoopManager")
    assert rollout.custom["seer"]["backend"] == "http" and rollout.checkpoint_engine.backend == "naive"
    manager = SeerAgentLoopManager.create(config=cfg, llm_client=None, teacher_client=None,
                                          reward_loop_worker_handles=None)
    assert manager.client.url == "http://127.0.0.1:8000" and manager.rollout.response_length == 1024
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == "seer.integrations.verl"
