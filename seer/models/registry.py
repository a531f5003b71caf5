"""Architecture name (``config.json`` ``architectures[0]``) -> model class.

The loader asks the registry rather than branching on names, so adding a family is one entry here (plus its
flags in ``ModelConfig``). Llama, Qwen2 and Qwen3 share one implementation today.
"""

from __future__ import annotations

from torch import nn

from seer.models.config import SUPPORTED_ARCHITECTURES, ModelConfig
from seer.models.llama import CausalLM

_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": CausalLM,
    "Qwen2ForCausalLM": CausalLM,
    "Qwen3ForCausalLM": CausalLM,
}
assert set(_REGISTRY) == set(SUPPORTED_ARCHITECTURES), "registry and ModelConfig disagree on architectures"


def model_class(architecture: str) -> type[nn.Module]:
    try:
        return _REGISTRY[architecture]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unsupported architecture {architecture}; supported: {known}") from None


def build_model(config: ModelConfig) -> nn.Module:
    """An uninitialised-weights model for ``config`` (the loader fills the weights)."""
    return model_class(config.architecture)(config)
