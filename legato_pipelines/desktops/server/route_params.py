"""Request parsing of a local desktop server's routes: JSON or form parameters, typed fields,
error answers, actions from their JSON form.
"""

from __future__ import annotations

from dataclasses import fields

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse

from ...actions import Action

ACTION_FIELDS = {f.name for f in fields(Action)}


class BadRequest(ValueError):
    """A request field is missing or wrong (answered with 400 and the message)."""


async def request_params(request: Request) -> dict:
    """JSON body, or form fields (OSWorld's client sends both kinds)."""
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("application/json"):
        body = await request.body()
        if not body:
            return {}
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"body is not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise BadRequest("body must be a JSON object")
        return data
    if ctype.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        form = await request.form()
        return dict(form)
    return {}


def param(params: dict, name: str, kind=str, default=...):
    value = params.get(name, default)
    if value is ...:
        raise BadRequest(f"field {name!r} is required")
    if kind is bool and isinstance(value, str):
        value = value.lower() in ("1", "true", "yes")
    if value is not None and not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise BadRequest(f"field {name!r} must be {names}, got {type(value).__name__}")
    return value


def error_response(status: int, message: str, kind: str | None = None) -> JSONResponse:
    body = {"status": "error", "message": message}
    if kind:
        body["kind"] = kind
    return JSONResponse(body, status_code=status)


def parse_action(data: dict) -> Action:
    """An :class:`Action` from its JSON form (the dataclass fields). Raises :class:`BadRequest`."""
    unknown = set(data) - ACTION_FIELDS
    if unknown:
        raise BadRequest(
            f"unknown action field(s) {sorted(unknown)}; allowed: {sorted(ACTION_FIELDS)}"
        )
    if not isinstance(data.get("action"), str):
        raise BadRequest("field 'action' must be an action name string")
    values = dict(data)
    values["keys"] = tuple(values.get("keys") or ())
    values.setdefault("arguments", {})
    try:
        return Action(**values)
    except TypeError as exc:
        raise BadRequest(str(exc)) from None
