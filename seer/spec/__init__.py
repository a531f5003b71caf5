"""Adaptive grouped speculative decoding, the torch-free side: per-group suffix indexes, drafts, the draft
server, the draft-length policy and model-free replay. The engine's verifier consumes :class:`Draft`."""

from seer.spec.draft import EMPTY_DRAFT, Draft
from seer.spec.draft_server import DraftRequest, DraftRequestError, DraftServer, DraftServerConfig, UnknownGroupError
from seer.spec.drafter import DrafterConfig, SuffixDrafter
from seer.spec.metrics import SpecCounters, SpecMetrics
from seer.spec.policy import AcceptanceTracker, PolicyConfig, PolicyRequest, SpecPolicy, VerifyCostModel, t_sd
from seer.spec.suffix_tree import Match, SuffixIndex, SuffixIndexConfig

__all__ = [
    "Draft", "EMPTY_DRAFT", "DraftRequest", "DraftRequestError", "DraftServer", "DraftServerConfig",
    "UnknownGroupError", "DrafterConfig", "SuffixDrafter", "SpecCounters", "SpecMetrics", "AcceptanceTracker",
    "PolicyConfig", "PolicyRequest", "SpecPolicy", "VerifyCostModel", "t_sd", "Match", "SuffixIndex",
    "SuffixIndexConfig",
]
