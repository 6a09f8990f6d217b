"""Token authentication of a local desktop server: every request carries the desktop's token."""

from __future__ import annotations

import hmac


class TokenAuth:
    """ASGI middleware: 401 unless the request carries the desktop's token."""

    def __init__(self, app, token: str):
        if not token:
            raise ValueError("the desktop token is empty")
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            auth = headers.get(b"authorization", b"")
            given = (
                auth[7:] if auth[:7].lower() == b"bearer " else headers.get(b"x-legato-token", b"")
            )
            if not given or not hmac.compare_digest(given, self._token):
                body = b'{"status":"error","message":"missing or wrong desktop token (Authorization: Bearer <token>)"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
