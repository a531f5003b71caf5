"""Seer's HTTP rollout server: OpenAI-compatible and SGLang-style endpoints in front of the rollout coordinator.

Frameworks that drive vLLM or SGLang servers (verl, OpenRLHF, slime) can point at ``seer serve`` unchanged;
requests arriving together are run as one rollout (``batcher``), separate requests for one prompt are sampled
as one group (``grouping``), results stream back per chunk. One concept per module: ``config`` (settings and
limits), ``protocol`` (request bodies, errors), ``convert`` (requests to groups), ``grouping``, ``batcher``
(asyncio <-> worker thread), ``sequences`` (stop strings, streamed text), ``render`` (response shapes),
``collect`` (one request's lifecycle), the route modules, ``security``, ``metrics``, ``app``, ``serving``.
FastAPI and uvicorn are imported only here, never by the engine: install the ``serve`` extra.
"""

from seer.server.config import ModelLimits, ServerConfig

__all__ = ["ModelLimits", "ServerConfig", "create_app"]


def __getattr__(name: str):
    if name == "create_app":
        from seer.server.app import create_app

        return create_app
    raise AttributeError(name)
