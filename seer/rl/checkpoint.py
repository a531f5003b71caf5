"""Checkpoints that resume a run exactly: weights, optimizer, LR schedule, RNG states, iteration, data cursor.

Layout: ``<output_dir>/checkpoints/iter_000010/`` holds ``model.safetensors`` plus the base model's config and
tokenizer files, so a checkpoint is itself a model directory (``seer generate --model <it>`` works), and
``trainer_state.pt`` with everything else. A checkpoint is written to a temporary name and renamed when
complete, so a crash mid-save never leaves a half checkpoint that ``--resume`` would pick; only the newest
``keep`` are kept.

Why the RNG states although sampling is seeded per response: anything a user adds that draws from torch,
numpy or ``random`` (dropout, data augmentation) must also continue identically.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from seer.models.loader import hf_state_dict, load_weights

STATE_FILE = "trainer_state.pt"
WEIGHTS_FILE = "model.safetensors"
_PREFIX = "iter_"


@dataclass
class TrainerState:
    """What the loop needs to continue: iterations completed, prompts consumed, the policy's weight version."""

    iteration: int = 0
    cursor: int = 0
    weight_version: int = 0

    def check_integrity(self) -> None:
        if min(self.iteration, self.cursor, self.weight_version) < 0:
            raise AssertionError(f"negative trainer state: {self}")
        if self.weight_version > self.iteration:
            raise AssertionError(f"weight version {self.weight_version} > iterations done {self.iteration}: "
                                 "every version comes from one iteration's update")


def rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                              "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def checkpoint_dir(root: str | Path, iteration: int) -> Path:
    return Path(root) / f"{_PREFIX}{iteration:06d}"


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX) and p.name[len(_PREFIX):]
             .isdigit() and (p / STATE_FILE).is_file() and (p / WEIGHTS_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX):]))


def save_checkpoint(root: str | Path, state: TrainerState, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, base_model_dir: str | Path, keep: int = 2) -> Path:
    """Write a checkpoint for ``state.iteration``; returns its directory."""
    state.check_integrity()
    final = checkpoint_dir(root, state.iteration)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in Path(base_model_dir).iterdir():  # config, generation config, tokenizer: a loadable model dir
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, tmp / f.name)
    weights = {k: v.detach().contiguous().cpu() for k, v in hf_state_dict(model).items()}
    save_file(weights, str(tmp / WEIGHTS_FILE))
    torch.save({"state": asdict(state), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": rng_states()}, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
                    ) -> TrainerState:
    """Restore weights, optimizer, scheduler and RNG states in place; returns the trainer state."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    blob = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)  # our own file: trusted
    load_weights(model, path)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    set_rng_states(blob["rng"])
    state = TrainerState(**blob["state"])
    state.check_integrity()
    return state
