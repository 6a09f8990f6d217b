"""Attempt statuses (docs/architecture.md §3). Every execution ends in exactly one record with one
of these, so ``count(records) == scheduled + retries`` always holds.

Defined once with the record format in :mod:`legato_pipelines.record` (what each status means
is documented there); re-exported here for the engine's readers.
"""

from ..record import (  # noqa: F401
    CANCELLED,
    ERROR,
    FINAL_FOR_TRAINING,
    OK,
    RETRIED,
    SKIPPED,
    STATUSES,
    SURPLUS,
    TRUNCATED,
    is_final,
)
