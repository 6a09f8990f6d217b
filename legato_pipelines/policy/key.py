"""The policy API key: read from the environment variable ``LEGATO_POLICY_KEY`` only.

There is no flag or field to pass it; it is never part of a config's ``repr``/``model_dump``
and never reaches a log line, record, Dagster metadata or exception message (the wire module
redacts it from whatever a server quotes back).
"""

from __future__ import annotations

import os

API_KEY_ENV = "LEGATO_POLICY_KEY"


def policy_api_key() -> str | None:
    """The policy API key from ``LEGATO_POLICY_KEY`` (``None`` when unset or empty)."""
    return os.environ.get(API_KEY_ENV) or None
