"""Policy versions in training order: the training step a partition key carries.

Keys like ``step-50``, ``step_1200``, ``ckpt-3``, ``checkpoint-7``, ``global_step300``, ``v2``
or a bare ``42`` carry a step; reports, charts and tables sort by it (``step-50`` before
``step-100``), never as text or by creation order. Keys without one (``demo-2026...-ab12``,
a model id) sort after the numbered ones, by name.

Which keys can be versions at all is decided here once, by :func:`check_version_key`: every
place a key enters (``legato collect/demo/view --version``, the Dagster partition a run
materializes, the checkpoint sensor's folders and model ids) calls it.

Bottom layer: imports nothing else from the package but its errors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .errors import ConfigError

KEY_CHARS = "letters, digits, '.', '_' and '-'"
"""What a version key is made of (:func:`check_version_key`)."""
MAX_KEY_LENGTH = 200
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_NOT_KEY_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def check_version_key(key: object) -> str:
    """Return ``key`` when it can be a policy version: a Dagster dynamic partition key and the
    lake folder ``<table>/policy_version=<key>`` that pyarrow, pandas and DuckDB read back as
    that same value.

    A key is 1 to :data:`MAX_KEY_LENGTH` of :data:`KEY_CHARS`, starting with a letter or
    digit, without ``...`` (Dagster's rule). Anything else, ``=`` above all (DuckDB's hive
    partitioning reads ``policy_version=step-5_lr=3e-6`` as two keys and refuses every
    table), ``/``, spaces and control characters, raises
    :class:`~legato_pipelines.errors.ConfigError` ``"policy_version '<key>': <why> (fix: ...)"``
    with a key to use instead; the caller puts the field it came from in front.
    """
    if not isinstance(key, str) or not key:
        raise ConfigError(
            f"policy_version {key!r}: a version key must be a non-empty string of {KEY_CHARS} "
            "(fix: e.g. 'step-7')"
        )
    if _KEY.fullmatch(key) and "..." not in key and len(key) <= MAX_KEY_LENGTH:
        return key
    bad = sorted(set("".join(_NOT_KEY_CHARS.findall(key))))
    if bad:
        why = f"{', '.join(repr(c) for c in bad)} cannot be in a version key"
    elif "..." in key:
        why = "'...' cannot be in a version key (Dagster refuses it)"
    elif len(key) > MAX_KEY_LENGTH:
        why = f"longer than {MAX_KEY_LENGTH} characters"
    else:
        why = "a version key starts with a letter or a digit"
    raise ConfigError(
        f"policy_version {key!r}: {why}; a version key is {KEY_CHARS} (it names the lake "
        f"folder policy_version=<key>) (fix: use {suggest_version_key(key)!r})"
    )


def suggest_version_key(key: str) -> str:
    """A valid key close to ``key``: each run of other characters becomes ``-`` (``/`` too),
    ``...`` becomes ``.``, cut to :data:`MAX_KEY_LENGTH`; ``"v"`` when nothing is left."""
    text = _NOT_KEY_CHARS.sub("-", key)
    while "..." in text:
        text = text.replace("...", ".")
    text = text.lstrip("._-")[:MAX_KEY_LENGTH].rstrip("._-")
    return text or "v"


_STEP = re.compile(
    r"^(?:.*[-_./=:])?(?:global_step|checkpoint|ckpt|step|iter|it|v)?[-_]?(\d+)$", re.IGNORECASE
)


def version_step(key: str | None) -> int | None:
    """The training step in a policy-version key (``step-50`` -> 50), or ``None`` when the
    key carries none."""
    if not key:
        return None
    match = _STEP.match(key)
    return int(match.group(1)) if match else None


def version_sort_key(key: str) -> tuple[int, int, str]:
    """Sort key: numbered versions by step, then the others by name."""
    step = version_step(key)
    return (0, step, key) if step is not None else (1, 0, key)


def sort_versions(keys: Iterable[str]) -> list[str]:
    """``keys`` in training order (see :func:`version_sort_key`)."""
    return sorted(keys, key=version_sort_key)
