"""``SeerAgentLoopManager``: verl's rollout manager slot filled by Seer.

verl's PPO/GRPO trainer (``RayPPOTrainer``; in verl 0.9 the legacy trainer, ``trainer.use_v1=false``) builds its
rollout manager from ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (default: verl's
``AgentLoopManager``) and calls ``generate_sequences(batch)`` once per step with the whole batch (each prompt
repeated ``rollout.n`` times, interleaved); verl 0.8 also hands the manager's ``rollout_replicas`` to its
checkpoint manager, verl 0.9 takes them from its ``LLMServerManager`` (``replica.SeerReplica``). Where verl's
manager splits the batch over agent-loop workers that send every sample as its own request, this one sends the
batch to Seer as groups in one call: exactly the view Seer's divided rollout, context-aware scheduling and
grouped drafting need.

Weights travel the other way through verl's own path: with ``checkpoint_engine.backend=naive`` the trainer
calls each training worker's ``update_weights``, which pushes the new tensors into the worker's
``SeerServerAdapter`` (``rollout.name=seer``), which rank 0 forwards to Seer. The replicas here (verl 0.8) are
stubs with the async methods verl calls on replicas (Seer runs on its own devices: nothing to sleep or wake).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from seer.integrations.verl.batching import cfg_get, seer_options
from seer.integrations.verl.rollout import SeerVerlRollout


class _StubReplica:
    """What verl's checkpoint manager and trainer call on a rollout replica; Seer needs none of it."""

    def __init__(self, replica_rank: int = 0, server_address: str | None = None) -> None:
        self.replica_rank = replica_rank
        self.workers: list = []
        self.servers: list = []
        self._server_address = server_address
        self._server_handle = None

    @property
    def server_address(self) -> str | None:
        return self._server_address

    @property
    def server_handle(self):
        return self._server_handle

    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def abort_all_requests(self) -> None:
        return None

    async def resume_all_requests(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def start_profile(self, **kwargs) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


def _load_tokenizer(model_path: str | None, config: Any):
    """verl's own HF tokenizer when verl is importable (token-for-token what verl's agent loop renders), else
    Seer's tokenizer on the same directory."""
    if model_path is None:
        return None
    custom_template = cfg_get(cfg_get(cfg_get(config, "actor_rollout_ref"), "model"), "custom_chat_template")
    try:
        from verl.utils import hf_tokenizer
        from verl.utils.fs import copy_to_local

        tok = hf_tokenizer(copy_to_local(model_path), trust_remote_code=True)
    except ImportError:
        from seer.models.tokenizer import Tokenizer

        tok = Tokenizer.from_dir(model_path)
    if custom_template is not None:
        tok.chat_template = custom_template
    return tok


class SeerAgentLoopManager:
    """Drop-in for verl's ``AgentLoopManager`` in its legacy ``RayPPOTrainer`` (DataProto in, DataProto out).

    Constructed as verl 0.9 does (``SeerAgentLoopManager.create(config=..., llm_client=..., teacher_client=...,
    reward_loop_worker_handles=...)``) or as verl 0.8 does (``SeerAgentLoopManager(config, worker_group,
    rollout_resource_pool, rm_resource_pool)``). ``client``/``tokenizer`` may be passed directly (tests, custom
    trainers); otherwise they come from ``actor_rollout_ref.rollout.custom.seer`` and the model path.

    Rewards: given verl 0.9's ``reward_loop_worker_handles`` (rule-based rewards, or a reward model on its own
    pool), the manager scores every response on those workers, as verl's agent loop does, and returns
    ``rm_scores`` (the score on each response's last token) with the reward extras. Without them it returns
    the batch's own fields so the trainer can score (verl 0.8's reward function, or a colocated reward model).
    """

    def __init__(self, config: Any, *args: Any, client=None, tokenizer=None, llm_client: Any = None,
                 teacher_client: Any = None, reward_loop_worker_handles: list | None = None, **kwargs: Any) -> None:
        import seer.integrations.verl as seer_verl

        seer_verl.register()
        if teacher_client is not None:
            raise NotImplementedError("Seer's rollout manager does not run verl's on-policy distillation "
                                      "(teacher models)")
        self.config = config
        self.reward_loop_worker_handles = reward_loop_worker_handles
        arr = cfg_get(config, "actor_rollout_ref")
        self.rollout_config = cfg_get(arr, "rollout")
        model_path = cfg_get(cfg_get(arr, "model"), "path")
        self.options = seer_options(self.rollout_config)
        if cfg_get(cfg_get(self.rollout_config, "checkpoint_engine"), "backend", "naive") not in ("naive", None):
            raise ValueError("Seer receives weights through verl's 'naive' checkpoint engine (the trainer pushes "
                             "them via the worker's rollout adapter); set "
                             "actor_rollout_ref.rollout.checkpoint_engine.backend=naive")
        if client is None:
            from seer.integrations.verl.client import make_client
            client = make_client(self.options, model_path=model_path)
        if tokenizer is None:
            tokenizer = _load_tokenizer(self.options.get("tokenizer") or model_path, config)
        template_kwargs = cfg_get(cfg_get(config, "data"), "apply_chat_template_kwargs") or {}
        self.client = client
        self.rollout = SeerVerlRollout(client, self.rollout_config, tokenizer=tokenizer,
                                       pad_token_id=self.options.get("pad_token_id"),
                                       seed=self.options.get("seed"),
                                       chat_template_kwargs=dict(template_kwargs))
        # verl 0.8 hands these to its checkpoint manager; verl 0.9 takes replicas from its LLMServerManager
        self.rollout_replicas = [_StubReplica(0, self.options.get("url"))]
        self.server_addresses = [r.server_address for r in self.rollout_replicas]
        self.server_handles = [r.server_handle for r in self.rollout_replicas]

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> "SeerAgentLoopManager":
        """verl 0.9's constructor entry point (synchronous here: nothing to start)."""
        return cls(*args, **kwargs)

    def generate_sequences(self, prompts):
        """One rollout of the whole batch through Seer; verl's output layout, in verl's row order."""
        out = self.rollout.generate_sequences(prompts)
        t0 = time.perf_counter()
        if self.reward_loop_worker_handles:
            self._score(out, prompts.non_tensor_batch)
            out.meta_info["timing"]["seer/compute_score_s"] = time.perf_counter() - t0
        else:
            for key, value in prompts.non_tensor_batch.items():
                out.non_tensor_batch.setdefault(key, value)
        return out

    def _score(self, out, inputs: dict) -> None:
        """Score every response on verl's reward-loop workers; adds ``rm_scores`` and the reward extras."""
        import numpy as np
        import ray
        import torch
        from verl import DataProto

        fields = {k: v for k, v in inputs.items() if k != "__do_sample__"}
        fields.update({k: v for k, v in out.non_tensor_batch.items() if k not in fields})
        keys = ["prompts", "responses", "attention_mask", "input_ids", "position_ids"]
        data = DataProto.from_dict(tensors={k: out.batch[k] for k in keys}, non_tensors=fields)
        handles = list(self.reward_loop_worker_handles)
        bounds = np.linspace(0, len(data), num=min(len(handles), len(data)) + 1).astype(int)
        futures = [h.compute_score_batch.remote(data.slice(int(a), int(b)))
                   for h, a, b in zip(handles, bounds[:-1], bounds[1:]) if b > a]
        parts = [ray.get(f) if isinstance(f, ray.ObjectRef) else f for f in futures]
        results = [r for part in parts for r in part]
        mask = out.batch["response_mask"]
        last = (mask.sum(dim=1) - 1).clamp(min=0)
        rm_scores = torch.zeros_like(mask, dtype=torch.float32)
        rm_scores[torch.arange(len(results)), last] = torch.tensor([float(r["reward_score"]) for r in results])
        out.batch["rm_scores"] = rm_scores
        extras = [r.get("reward_extra_info", {}) or {} for r in results]
        extra_keys = list(extras[0].keys()) if extras else []
        for key in extra_keys:
            out.non_tensor_batch[key] = np.array([e.get(key) for e in extras])
        out.meta_info["reward_extra_keys"] = extra_keys

    def clear_kv_cache(self) -> None:
        self._run_all([r.clear_kv_cache() for r in self.rollout_replicas])

    def start_profile(self, **kwargs) -> None:
        self._run_all([r.start_profile(**kwargs) for r in self.rollout_replicas])

    def stop_profile(self) -> None:
        self._run_all([r.stop_profile() for r in self.rollout_replicas])

    def wake_up(self) -> None:
        self._run_all([r.wake_up() for r in self.rollout_replicas])

    def sleep(self) -> None:
        self._run_all([r.sleep() for r in self.rollout_replicas])

    @staticmethod
    def _run_all(tasks: list) -> None:
        async def run_all():
            await asyncio.gather(*tasks)

        asyncio.run(run_all())
