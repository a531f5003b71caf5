"""Load HF safetensors checkpoints into our models, and push new weights into a live model (RL weight sync).

Weights are read with ``safetensors.safe_open`` (memory-mapped) and copied straight into parameters that were
allocated once, in the target dtype and device, without random initialisation (the model is built on the meta
device). HF names map 1:1 onto ours except the fused projections: ``q_proj``/``k_proj``/``v_proj`` fill row
slices of ``qkv_proj`` and ``gate_proj``/``up_proj`` fill ``gate_up_proj``. Every parameter row must be covered
and every checkpoint tensor must be used, otherwise loading fails naming the tensors: a silently half-loaded
model produces plausible garbage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from seer.models.config import ModelConfig
from seer.models.registry import build_model

_FUSED = {  # HF projection -> (our fused projection, shard index)
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry


def _shard_bounds(config: ModelConfig, fused: str, shard: int) -> tuple[int, int]:
    if fused == "qkv_proj":
        sizes = [config.q_size, config.kv_size, config.kv_size]
    else:
        sizes = [config.intermediate_size, config.intermediate_size]
    start = sum(sizes[:shard])
    return start, start + sizes[shard]


def _target(config: ModelConfig, name: str) -> tuple[str, tuple[int, int] | None]:
    """HF (or our own) tensor name -> (our parameter name, row range or None for the whole tensor)."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[-2] in _FUSED:
        fused, shard = _FUSED[parts[-2]]
        return ".".join(parts[:-2] + [fused, parts[-1]]), _shard_bounds(config, fused, shard)
    return name, None


def _safetensors_files(root: Path) -> list[Path]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({root / f for f in weight_map.values()})
    else:
        files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {root}")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"safetensors shards listed in the index are missing: {missing}")
    return files


def iter_checkpoint(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of a checkpoint directory, one tensor in memory at a time."""
    for file in _safetensors_files(Path(path)):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


@torch.no_grad()
def load_weights(model: nn.Module, source: str | Path | Mapping[str, torch.Tensor], strict: bool = True
                 ) -> list[str]:
    """Copy weights (HF names or ours) into ``model`` in place; returns the parameter names written.

    ``source`` is a checkpoint directory or a state dict. With ``strict`` every parameter must be fully
    written (a partial update raises); unknown or mis-shaped tensors always raise.
    """
    config: ModelConfig = model.config
    params = dict(model.named_parameters())  # tied lm_head.weight appears once, as embed_tokens
    tied = config.tie_word_embeddings
    items = source.items() if isinstance(source, Mapping) else iter_checkpoint(source)
    covered: dict[str, int] = {}
    unexpected: list[str] = []
    for name, tensor in items:
        if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue
        target, rows = _target(config, name)
        param = params.get(target)
        if param is None:
            unexpected.append(name)
            continue
        dst = param if rows is None else param[rows[0]: rows[1]]
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ValueError(f"tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}")
        dst.copy_(tensor)
        covered[target] = covered.get(target, 0) + dst.shape[0]
    if unexpected:
        raise ValueError(f"checkpoint has {len(unexpected)} tensors this {config.architecture} model does not "
                         f"use: {sorted(unexpected)[:10]}")
    if strict:
        missing = [n for n, p in params.items() if covered.get(n, 0) < p.shape[0]]
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} tensors: {sorted(missing)[:10]}")
    return sorted(covered)


def hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Our parameters under HF names (fused projections split into views), e.g. to save or to sync."""
    config: ModelConfig = model.config
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        parts = name.split(".")
        if len(parts) >= 3 and parts[-2] in ("qkv_proj", "gate_up_proj"):
            for hf, (fused, shard) in _FUSED.items():
                if fused == parts[-2]:
                    lo, hi = _shard_bounds(config, fused, shard)
                    out[".".join(parts[:-2] + [hf, parts[-1]])] = tensor[lo:hi]
        elif not (config.tie_word_embeddings and name == "lm_head.weight"):
            out[name] = tensor
    return out


def load_model(path: str | Path, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
               requires_grad: bool = False) -> tuple[nn.Module, ModelConfig]:
    """Build the model of an HF directory and load its safetensors weights: returns (model, config).

    The model is in eval mode; parameters do not require grad unless ``requires_grad`` (training).
    """
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"unsupported dtype {dtype}; use torch.float32 or torch.bfloat16")
    config = ModelConfig.from_dir(path)
    with torch.device("meta"):
        model = build_model(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.tie_weights()
    load_weights(model, path)
    model.eval().requires_grad_(requires_grad)
    return model, config
