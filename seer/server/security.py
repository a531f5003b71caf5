"""The door of the server: optional API key and a request size limit, before any route sees the request.

Why a plain ASGI middleware: both checks must hold for every route, including ones added later, and must not
depend on how a route reads its body. The body is read here, at most ``max_body_bytes`` of it (a client that
sends more gets 413 without the server buffering the rest), then replayed to the app; after the replay, the
app's ``receive`` is the connection's own, so routes still hear ``http.disconnect`` when a client goes away.
The key is compared in constant time; ``/health`` stays open so load balancers can probe without it.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from seer.server.protocol import error_body

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health"})


async def send_json(send: Send, status: int, body: dict[str, Any],
                    headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": data})


class Guard:
    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int,
                 on_status: Callable[[str, int], None] | None = None) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.on_status = on_status  # hears the status of every response (metrics)

    def _authorized(self, scope: Scope) -> bool:
        if self.api_key is None or scope.get("path") in OPEN_PATHS:
            return True
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        token = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        return hmac.compare_digest(token, self.api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.on_status is not None:
            send = self._reporting(scope.get("path", ""), send)
        if not self._authorized(scope):
            await send_json(send, 401, error_body(
                "Incorrect or missing API key: send 'Authorization: Bearer <key>'", "authentication_error",
                code="invalid_api_key"), [(b"www-authenticate", b"Bearer")])
            return
        too_large = error_body(f"the request body exceeds {self.max_body_bytes} bytes", code="request_too_large")
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await send_json(send, 413, too_large)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body_bytes:
                await send_json(send, 413, too_large)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _reporting(self, path: str, send: Send) -> Send:
        report = self.on_status

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start" and report is not None:
                report(path, int(message["status"]))
            await send(message)

        return wrapped
