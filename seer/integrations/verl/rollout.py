"""``SeerVerlRollout``: verl's ``generate_sequences(DataProto) -> DataProto`` on top of any Seer client.

Input: a verl generation batch in either of verl's two shapes.

- Token form (verl's ``BaseRollout.generate_sequences`` contract, used by its older vLLM/SGLang rollouts and by
  custom trainers): ``batch['input_ids']`` left-padded, ``batch['attention_mask']``, ``batch['position_ids']``.
  The prompts come back unchanged in ``prompts`` and response positions continue the given ones.
- Message form (what verl's trainer sends its ``AgentLoopManager`` since the agent loop became the only rollout
  path): ``non_tensor_batch['raw_prompt']`` holds chat messages; they are rendered with the model's chat
  template (``data.apply_chat_template_kwargs`` and ``model.custom_chat_template`` honoured, like verl's
  single-turn agent loop) and left-padded to ``rollout.prompt_length``.

Rows are folded into Seer groups by ``uid`` (see ``batching``), the whole batch goes to Seer in one call, and
the responses come back in verl's row order as the tensors verl's trainer reads (``batching.pack_rows``), with
``meta_info['timing']`` (the trainer requires it) holding Seer's rollout metrics.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from seer.integrations.verl.batching import (
    SeerResponse,
    cfg_get,
    group_rows,
    group_seed,
    left_pad,
    pack_rows,
    sampling_params,
)
from seer.rollout.types import GroupInput

GREEDY = "greedy"


def _apply_template(tokenizer, messages, **kwargs) -> list[int]:
    out = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True, **kwargs)
    if isinstance(out, Mapping) or hasattr(out, "keys"):  # transformers 5 may answer a BatchEncoding
        out = out["input_ids"]
    if isinstance(out, torch.Tensor):
        out = out.tolist()
    if out and isinstance(out[0], (list, tuple)):
        out = out[0]
    return [int(t) for t in out]


class SeerVerlRollout:
    """Turns verl generation batches into Seer rollouts and back.

    ``rollout_config``: verl's ``actor_rollout_ref.rollout`` (DictConfig, verl ``RolloutConfig`` or a dict):
    temperature/top_p/top_k/val_kwargs/response_length/prompt_length/calculate_log_probs are read from it.
    ``tokenizer``: anything with ``apply_chat_template`` (HF or Seer's), needed for the message form only.
    ``seed``: base seed; each (step, group) then gets its own derived seed. None leaves sampling unseeded.
    """

    def __init__(self, client, rollout_config: Any = None, *, tokenizer=None, pad_token_id: int | None = None,
                 seed: int | None = None, chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.client = client
        self.rollout_config = rollout_config if rollout_config is not None else {}
        self.tokenizer = tokenizer
        if pad_token_id is None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id: int | None = int(pad_token_id) if pad_token_id is not None else None
        self.seed = seed
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.calls = 0

    # ------------------------------------------------------------------------------------------ settings
    @property
    def response_length(self) -> int:
        return int(cfg_get(self.rollout_config, "response_length", 512))

    @property
    def prompt_length(self) -> int:
        return int(cfg_get(self.rollout_config, "prompt_length", 512))

    @property
    def with_logprobs(self) -> bool:
        return bool(cfg_get(self.rollout_config, "calculate_log_probs", True))

    # ---------------------------------------------------------------------------------------------- core
    def _prompts(self, tensors: Mapping[str, torch.Tensor], non_tensor: Mapping[str, Any], pad: int):
        """(per-row prompt token lists, left-padded ids, mask, position ids or None)."""
        if tensors is not None and "input_ids" in tensors.keys():
            ids = tensors["input_ids"].to("cpu")
            mask = tensors["attention_mask"].to("cpu") if "attention_mask" in tensors.keys() \
                else (ids != pad).to(torch.long)
            pos = tensors["position_ids"].to("cpu") if "position_ids" in tensors.keys() else None
            prompts = [ids[i][mask[i].bool()].tolist() for i in range(ids.shape[0])]
            return prompts, ids, mask, pos
        if "raw_prompt" in non_tensor:
            if self.tokenizer is None:
                raise ValueError("a batch of chat messages (non_tensor_batch['raw_prompt']) needs a tokenizer")
            for key in ("multi_modal_data", "multi_modal_inputs"):
                if key in non_tensor and any(v for v in non_tensor[key]):
                    raise NotImplementedError("the Seer verl adapter serves text-only models (batch has "
                                              f"{key!r})")
            names = non_tensor.get("agent_name")
            if names is not None and any(n not in (None, "single_turn_agent") for n in names):
                raise NotImplementedError(
                    "the Seer verl adapter runs single-turn rollouts (agent_name 'single_turn_agent'); "
                    f"got {sorted({str(n) for n in names})}")
            prompts = [_apply_template(self.tokenizer, m, **self.chat_template_kwargs)
                       for m in non_tensor["raw_prompt"]]
            ids, mask = left_pad(prompts, self.prompt_length, pad)
            return prompts, ids, mask, None
        raise ValueError("verl batch has neither batch['input_ids'] nor non_tensor_batch['raw_prompt']")

    def generate_arrays(self, tensors: Mapping[str, torch.Tensor] | None, non_tensor: Mapping[str, Any],
                        meta_info: Mapping[str, Any] | None = None):
        """The verl-free core: (output tensors, output non-tensor arrays, output meta_info)."""
        meta = dict(meta_info or {})
        t0 = time.perf_counter()
        # padding id: given or the tokenizer's, else the batch's meta_info (verl sets it), else 0
        pad = self.pad_token_id if self.pad_token_id is not None else int(meta.get("pad_token_id") or 0)
        prompts, ids, mask, pos = self._prompts(tensors, non_tensor or {}, pad)
        if not prompts:
            raise ValueError("empty verl batch: no rows to generate for")
        uids = non_tensor.get("uid") if non_tensor else None
        # verl's REMAX adds greedy baseline rows (``__do_sample__`` False) that share their uid: own groups
        do_sample = non_tensor.get("__do_sample__") if non_tensor else None
        variants = None
        if do_sample is not None and not meta.get("validate", False):
            variants = ["" if bool(x) else GREEDY for x in do_sample]
        grouping = group_rows(prompts, None if uids is None else list(uids), variants)
        step = int(meta.get("global_steps", self.calls))
        groups = [GroupInput(p, size, sampling_params(self.rollout_config, meta, seed=group_seed(self.seed, step, g),
                                                      greedy=key.endswith("|" + GREEDY)), key=key)
                  for g, (p, size, key) in enumerate(zip(grouping.prompts, grouping.sizes, grouping.keys))]
        t_prep = time.perf_counter() - t0
        out = self.client.rollout(groups)
        t_gen = time.perf_counter() - t0 - t_prep
        rows: list[SeerResponse] = [out[s.group][s.index] for s in grouping.slots]
        tensors_out = pack_rows(ids, mask, rows, self.response_length, pad, pos, self.with_logprobs)
        non_tensor_out: dict[str, np.ndarray] = {
            "__num_turns__": np.full(len(rows), 2, dtype=np.int32),
            "seer_finish_reason": np.array([r.finish_reason for r in rows], dtype=object),
        }
        if tensors is None or "input_ids" not in tensors.keys():
            if "raw_prompt" in non_tensor:  # verl's agent loop hands the messages back for reward functions
                non_tensor_out["raw_prompt"] = np.asarray(non_tensor["raw_prompt"], dtype=object)
        versions = {r.weight_version for r in rows if r.weight_version is not None}
        lengths = tensors_out["response_mask"].sum(dim=1).to(torch.float32)
        timing = {"seer/prepare_s": t_prep, "seer/generate_s": t_gen, "seer/num_groups": float(len(groups)),
                  "seer/response_length_mean": float(lengths.mean()) if len(rows) else 0.0,
                  "seer/response_length_max": float(lengths.max()) if len(rows) else 0.0}
        timing.update(getattr(self.client, "last_metrics", {}) or {})
        if len(versions) == 1:
            timing["seer/weight_version"] = float(versions.pop())
        elif len(versions) > 1:
            raise RuntimeError(f"one rollout mixed weight versions {sorted(versions)}")
        self.calls += 1
        return tensors_out, non_tensor_out, {"timing": timing}

    def generate_sequences(self, prompts):
        """verl ``DataProto`` in, verl ``DataProto`` out (needs verl installed)."""
        from tensordict import TensorDict
        from verl import DataProto

        tensors = prompts.batch if prompts.batch is not None and len(prompts.batch.keys()) else None
        tensors_out, non_tensor_out, meta_out = self.generate_arrays(tensors, prompts.non_tensor_batch,
                                                                     prompts.meta_info)
        bsz = tensors_out["responses"].shape[0]
        return DataProto(batch=TensorDict(tensors_out, batch_size=bsz), non_tensor_batch=non_tensor_out,
                         meta_info=meta_out)
