"""Running the app under uvicorn: in the foreground (``seer serve``) or in a background thread (tests, benches).

Why a ``uvicorn.Server`` subclass: on shutdown uvicorn first waits for open requests to finish, and only then
runs the app's shutdown hook; a client waiting for a long rollout would hold the server up until the rollout
ended. ``SeerServer.shutdown`` first fails every waiting and running request (503 OpenAI-style error, or an
error event on a stream) and aborts the rollout, so clients are answered at once and the wait is short.
"""

from __future__ import annotations

import logging
import threading
import time

import uvicorn

from seer.server.batcher import Batcher

log = logging.getLogger("seer.server")


class SeerServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, batcher: Batcher) -> None:
        super().__init__(config)
        self.batcher = batcher

    async def shutdown(self, sockets: list | None = None) -> None:  # type: ignore[override]
        self.batcher.shutdown("the server is shutting down")
        await super().shutdown(sockets)

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0)."""
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self.config.port)


def make_server(app: object, batcher: Batcher, host: str = "127.0.0.1", port: int = 8000,
                log_level: str = "warning", grace_s: float = 5.0) -> SeerServer:
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=grace_s, access_log=log_level in ("debug", "info"))
    return SeerServer(config, batcher)


class ServerThread:
    """A server on a background thread: ``start()`` returns once it accepts connections; ``stop()`` shuts down
    (answering pending clients with an error) and joins."""

    def __init__(self, app: object, batcher: Batcher, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning") -> None:
        self.server = make_server(app, batcher, host, port, log_level)
        self.host = host
        self.thread = threading.Thread(target=self.server.run, name="seer-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.server.port}"

    def start(self, timeout: float = 60.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the Seer server did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.thread.is_alive():
            log.warning("seer server thread still running after %.0f s", timeout)
