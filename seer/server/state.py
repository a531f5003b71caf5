"""What every route needs, built once per app: the coordinator, its tokenizer and limits, the batcher, metrics.

Why one object on ``app.state``: routes stay plain functions of the request, and tests can build an app around
a coordinator they also use in process (to compare results token for token).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request

from seer.models.tokenizer import Tokenizer
from seer.server.batcher import Batcher
from seer.server.config import ModelLimits, ServerConfig
from seer.server.convert import RequestConverter
from seer.server.metrics import ServerMetrics


@dataclass
class ServerState:
    coordinator: Any
    config: ServerConfig
    tokenizer: Tokenizer
    limits: ModelLimits
    metrics: ServerMetrics
    batcher: Batcher
    converter: RequestConverter

    @classmethod
    def build(cls, coordinator: Any, config: ServerConfig) -> "ServerState":
        limits = ModelLimits.of(coordinator)
        metrics = ServerMetrics()
        metrics.weight_version = coordinator.weight_version
        names = {config.model_name, str(coordinator.model), str(Path(coordinator.model).resolve()),
                 Path(coordinator.model).name}
        tokenizer = coordinator.tokenizer
        return cls(coordinator, config, tokenizer, limits, metrics, Batcher(coordinator, config, metrics),
                   RequestConverter(tokenizer, limits, config, names))


def server_state(request: Request) -> ServerState:
    return request.app.state.seer
