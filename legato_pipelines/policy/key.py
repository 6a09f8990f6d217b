"""The policy API key: read from the environment variable ``LEGATO_POLICY_KEY`` only.

There is no flag or field to pass it; it is never part of a config's ``repr``/``model_dump``
and never reaches a log line, record, Dagster metadata or exception message (the wire module
redacts it from whatever a server quotes back).

Whitespace around the value is stripped: a key mounted from a file (a Kubernetes secret, ``$(cat
key)``) often ends in a newline, which is not part of the key and is illegal in an HTTP header.
A key with any other character an HTTP header cannot carry (anything but visible ASCII, e.g. a
space or a non-ASCII letter inside it) is refused with a ``ConfigError`` naming
``LEGATO_POLICY_KEY``, never quoting the key.
"""

from __future__ import annotations

import os

from ..errors import ConfigError
from ..key_env import API_KEY_ENV

__all__ = ["API_KEY_ENV", "key_forms", "policy_api_key"]


def policy_api_key() -> str | None:
    """The policy API key from ``LEGATO_POLICY_KEY``, surrounding whitespace stripped (``None``
    when unset or blank). Raises ``ConfigError`` (not quoting the key) when it holds a character
    an HTTP header cannot carry (module doc)."""
    key = (os.environ.get(API_KEY_ENV) or "").strip()
    if not key:
        return None
    bad = next((i for i, ch in enumerate(key) if not 0x21 <= ord(ch) <= 0x7E), None)
    if bad is not None:
        raise ConfigError(
            f"{API_KEY_ENV} holds a character an HTTP header cannot carry (at position {bad + 1} "
            f"of {len(key)}: {_kind(key[bad])}); the key is not shown (fix: set {API_KEY_ENV} "
            "to the server's API key alone, visible ASCII only)"
        )
    return key


def _kind(ch: str) -> str:
    if ord(ch) > 0x7E:
        return "a non-ASCII character"
    if ch == " ":
        return "a space"
    return "a control character"


def key_forms() -> list[str]:
    """Every form in which the key as set (and stripped) may be quoted in an error: as is, and
    escaped as ``repr`` writes it (httpx quotes a bad header value escaped). Longest first; for
    :func:`~.wire.redact`, never raises."""
    raw = os.environ.get(API_KEY_ENV) or ""
    forms = set()
    for value in (raw, raw.strip()):
        if value.strip():
            forms.add(value)
            forms.add(repr(value)[1:-1])
            forms.add(repr(value.encode("utf-8", "surrogateescape"))[2:-1])
    return sorted((f for f in forms if f.strip()), key=len, reverse=True)
