"""verl rows <-> Seer groups, and the padded tensors verl's trainer reads. No verl import here.

verl sends a GRPO batch as rows: every prompt repeated ``n`` times, interleaved (``DataProto.repeat(n,
interleave=True)``), each row tagged with the ``uid`` of its dataset item. Seer wants groups: one prompt with
its G siblings, so that the prompt is prefilled once, the group's probe sets its length estimate and siblings
draft from each other. ``group_rows`` folds rows back into groups (by ``uid`` when the batch has one, else by
prompt tokens) and remembers, for every row, which (group, sibling) answers it, so responses return in verl's
row order whatever order Seer finishes them in. Validation batches padded to a divisor of the world size
repeat earlier rows; they simply make a group larger.

``pack_rows`` builds verl's output layout (the same one as verl's agent loop and its older vLLM rollout):
``prompts`` left-padded, ``responses`` right-padded to ``response_length``, ``input_ids`` = prompts +
responses, ``attention_mask`` over both, ``response_mask`` (1 for generated tokens), ``position_ids``
(cumulative over the attention mask, as ``verl.utils.model.compute_position_id_with_mask``) and
``rollout_log_probs`` (Seer's per-token logprobs, 0 on padding).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from seer.sampling_params import SamplingParams, group_seed  # noqa: F401 - group_seed is part of this API


@dataclass
class SeerResponse:
    """One finished response as any Seer client returns it."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None
    weight_version: int | None = None
    text: str | None = None


@dataclass(frozen=True)
class RowSlot:
    """Where the response of one verl row comes from: sibling ``index`` of group ``group``."""

    group: int
    index: int


@dataclass
class RowGrouping:
    prompts: list[tuple[int, ...]]        # one per group
    keys: list[str]                       # one per group: the uid, or a digest of the prompt
    sizes: list[int]                      # G per group
    slots: list[RowSlot] = field(default_factory=list)   # one per row, in verl's row order

    @property
    def num_rows(self) -> int:
        return len(self.slots)


def _prompt_key(prompt: Sequence[int]) -> str:
    return "p:" + hashlib.blake2b(repr(tuple(prompt)).encode(), digest_size=8).hexdigest()


def group_rows(prompts: Sequence[Sequence[int]], uids: Sequence[Any] | None = None,
               variants: Sequence[str] | None = None) -> RowGrouping:
    """Fold verl rows into Seer groups.

    Rows with the same ``uid`` form one group (their prompts must then be identical: a uid names one dataset
    item). Without uids, rows with identical prompt tokens form one group. Groups are numbered in order of
    first appearance and siblings in row order, so an interleaved batch maps row ``i`` to group ``i // n``.
    ``variants`` (one string per row) split rows that must be sampled differently, e.g. the greedy baseline
    rows of verl's REMAX that share their uid with the sampled ones; the variant is appended to the key.
    """
    if uids is not None and len(uids) != len(prompts):
        raise ValueError(f"{len(uids)} uids for {len(prompts)} rows")
    if variants is not None and len(variants) != len(prompts):
        raise ValueError(f"{len(variants)} variants for {len(prompts)} rows")
    out = RowGrouping([], [], [])
    by_key: dict[str, int] = {}
    for row, prompt in enumerate(prompts):
        prompt = tuple(int(t) for t in prompt)
        if not prompt:
            raise ValueError(f"row {row}: empty prompt (attention_mask selects no token)")
        key = f"uid:{uids[row]}" if uids is not None else _prompt_key(prompt)
        if variants is not None and variants[row]:
            key = f"{key}|{variants[row]}"
        g = by_key.get(key)
        if g is None:
            g = by_key[key] = len(out.prompts)
            out.prompts.append(prompt)
            out.keys.append(key)
            out.sizes.append(0)
        elif out.prompts[g] != prompt:
            raise ValueError(f"row {row}: uid {uids[row]!r} was already used with a different prompt; "
                             "a uid must name one prompt")
        out.slots.append(RowSlot(g, out.sizes[g]))
        out.sizes[g] += 1
    return out


def cfg_get(cfg: Any, name: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping):
        return cfg.get(name, default)
    getter = getattr(cfg, "get", None)
    if callable(getter) and not hasattr(type(cfg), "__dataclass_fields__"):
        try:
            return getter(name, default)
        except Exception:  # noqa: BLE001 - OmegaConf raises on some missing keys in struct mode
            pass
    return getattr(cfg, name, default)


def sampling_params(rollout_cfg: Any, meta_info: Mapping[str, Any] | None, *, seed: int | None = None,
                    max_tokens: int | None = None, greedy: bool = False) -> SamplingParams:
    """Seer ``SamplingParams`` from verl's rollout config and a batch's ``meta_info``.

    Training steps use ``rollout.temperature/top_p/top_k`` (``meta_info['temperature']`` wins, as the trainer
    sets it); validation batches (``meta_info['validate']``) use ``rollout.val_kwargs``. ``do_sample=False``
    (meta_info or val_kwargs) means greedy, and so does ``greedy`` (verl's per-row ``__do_sample__=False``).
    verl's ``top_k`` of -1 or 0 means off. ``max_tokens`` is ``rollout.response_length``.
    """
    meta = dict(meta_info or {})
    validate = bool(meta.get("validate", False))
    src = cfg_get(rollout_cfg, "val_kwargs") if validate else rollout_cfg
    temperature = cfg_get(src, "temperature", 1.0)
    if not validate and "temperature" in meta:
        temperature = meta["temperature"]
    top_p = cfg_get(src, "top_p", 1.0)
    top_k = cfg_get(src, "top_k", -1)
    do_sample = meta.get("do_sample", cfg_get(src, "do_sample", True) if validate else True)
    if not do_sample or greedy:
        temperature, top_p, top_k = 0.0, 1.0, -1
    top_k = int(top_k) if top_k is not None else -1
    if top_k <= 0:
        top_k = -1
    if max_tokens is None:
        max_tokens = int(cfg_get(rollout_cfg, "response_length", 512))
    return SamplingParams(n=1, temperature=float(temperature), top_p=float(top_p if top_p is not None else 1.0),
                          top_k=top_k, seed=seed, max_tokens=int(max_tokens))


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Positions counting attended tokens only (padding repeats its neighbour's position, clipped at 0)."""
    return torch.clip(torch.cumsum(mask, dim=-1) - 1, min=0)


def left_pad(prompts: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), left-padded to ``width``; a longer prompt raises."""
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if len(p) > width:
            raise ValueError(f"row {i}: prompt has {len(p)} tokens, more than rollout.prompt_length={width}")
        if p:
            ids[i, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids, mask


def pack_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, responses: Sequence[SeerResponse],
              response_length: int, pad_id: int, prompt_position_ids: torch.Tensor | None = None,
              with_logprobs: bool = True) -> dict[str, torch.Tensor]:
    """verl's output tensors for rows whose (left-padded) prompts and Seer responses are given, row-aligned.

    Responses longer than ``response_length`` are cut (Seer is asked for at most that many tokens, so this
    only guards). With ``prompt_position_ids`` (the batch's own, e.g. from the legacy token interface) the
    response positions continue from each row's last prompt position; otherwise all positions come from the
    attention mask.
    """
    bsz = prompt_ids.shape[0]
    if len(responses) != bsz:
        raise ValueError(f"{len(responses)} responses for {bsz} rows")
    resp = torch.full((bsz, response_length), pad_id, dtype=torch.long)
    resp_mask = torch.zeros((bsz, response_length), dtype=torch.long)
    logp = torch.zeros((bsz, response_length), dtype=torch.float32)
    for i, r in enumerate(responses):
        toks = list(r.token_ids)[:response_length]
        if toks:
            resp[i, : len(toks)] = torch.as_tensor(toks, dtype=torch.long)
            resp_mask[i, : len(toks)] = 1
            lps = list(r.logprobs)[: len(toks)]
            if len(lps) != len(toks):
                raise ValueError(f"row {i}: {len(toks)} tokens but {len(lps)} logprobs")
            logp[i, : len(toks)] = torch.as_tensor(lps, dtype=torch.float32)
    prompt_mask = prompt_mask.to(torch.long)
    attention_mask = torch.cat([prompt_mask, resp_mask], dim=1)
    if prompt_position_ids is not None and prompt_position_ids.dim() == 2:
        delta = torch.arange(1, response_length + 1, dtype=prompt_position_ids.dtype).unsqueeze(0)
        position_ids = torch.cat([prompt_position_ids, prompt_position_ids[:, -1:] + delta], dim=1)
    else:
        position_ids = position_ids_from_mask(attention_mask)
    out = {
        "prompts": prompt_ids.to(torch.long),
        "responses": resp,
        "response_mask": resp_mask,
        "input_ids": torch.cat([prompt_ids.to(torch.long), resp], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
    }
    if with_logprobs:
        out["rollout_log_probs"] = logp
    return out


def seer_options(rollout_config: Any) -> dict:
    """verl's ``actor_rollout_ref.rollout.custom.seer`` as a plain dict (empty when absent)."""
    custom = cfg_get(rollout_config, "custom")
    opts = cfg_get(custom, "seer") if custom is not None else None
    if opts is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf
        if isinstance(opts, DictConfig):
            return dict(OmegaConf.to_container(opts, resolve=True))
    except ImportError:  # verl always brings omegaconf; a plain dict needs none
        pass
    return dict(opts)
