"""What the rollout-bench tests share: a small token-id trace for the tiny models' vocabulary."""

from __future__ import annotations

import json
import random
from pathlib import Path


def write_token_trace(path: Path, groups: int, max_len: int, seed: int = 0) -> Path:
    """``groups`` groups of eight token-id responses of 3..max_len tokens plus an EOS (id 2), ids below 128 (the
    tiny vocabulary), prompts of eight tokens."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(groups):
            responses = [{"token_ids": [rng.randrange(5, 128) for _ in range(rng.randrange(3, max_len))] + [2]}
                         for _ in range(8)]
            f.write(json.dumps({"group_id": f"g{i}", "prompt_token_ids": [rng.randrange(5, 128) for _ in range(8)],
                                "responses": responses}) + "\n")
    return path
