"""Seer: fast synchronous on-policy RL rollouts (divided rollout, context-aware scheduling, grouped speculation)."""

from seer.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "LLM":  # lazy: importing torch is slow and the control plane does not need it
        from seer.llm import LLM
        return LLM
    raise AttributeError(name)
