"""The partitioning of every asset: one dynamic partition per policy version.

Keys are added by the checkpoint sensor (a new ``step-*`` checkpoint or model id), by
``legato demo``, or by hand (``dagster asset materialize --partition`` needs it to exist:
``DagsterUnknownPartitionError`` otherwise). Keys follow
:func:`~legato_pipelines.versions.check_version_key`: the sensor and ``legato demo`` add only
such keys; a key added by hand (the UI, ``add_dynamic_partitions``) is checked when a run
materializes it (:func:`partition_version`), before anything is collected or written.

A partition deleted while a run materializes it (the UI's "delete partition") would make
Dagster fail the step with an internal error as it stores the output. ``rollout_batch``
checks :func:`deleted_message` after collecting: it keeps the records, logs the message (what
was kept, ``legato lake drop`` to remove the version's rows) and ends without materializing,
so the run's later steps are skipped; the table assets check :func:`require_partition` before
writing the lake and fail with the same message.
"""

from __future__ import annotations

import dagster as dg

from ..errors import ConfigError
from ..versions import check_version_key

POLICY_VERSION = "policy_version"

policy_versions = dg.DynamicPartitionsDefinition(name=POLICY_VERSION)
"""Dynamic partitions ``policy_version`` (keep well under 100,000 keys: Dagster's limit)."""


def partition_version(context: dg.AssetExecutionContext) -> str:
    """The run's ``policy_version`` partition key, checked by
    :func:`~legato_pipelines.versions.check_version_key`. Raises ``ConfigError`` naming the
    partition, why the key cannot be a version and the fix (add the suggested key as a new
    partition and materialize that; delete the bad one in the UI's partitions view)."""
    key = context.partition_key
    try:
        return check_version_key(key)
    except ConfigError as exc:
        raise ConfigError(
            f"Dagster partition {POLICY_VERSION}={key!r}: {exc}; add that key as a new "
            f"{POLICY_VERSION} partition and materialize it, and delete {key!r} (Dagster UI: the "
            "asset's partitions, or instance.delete_dynamic_partition)"
        ) from None


def deleted_message(context: dg.AssetExecutionContext, version: str, kept: str) -> str | None:
    """``None`` while partition ``version`` exists; once it was deleted (while this run
    materialized it), the message to show: what the run keeps (``kept``: the collected
    records, or that nothing was written), ``legato lake drop`` to remove the version's rows
    from the lake and its views, and how to resume instead."""
    if context.instance.has_dynamic_partition(policy_versions.name, version):
        return None
    return (
        f"Dagster partition {POLICY_VERSION}={version!r} was deleted while this run "
        f"materialized it ({context.asset_key.to_user_string()}). {kept} To remove the "
        f"version from the lake and its views: `legato lake drop {version}` (add --run to "
        "remove its run directory too). To keep it instead: add the partition again and "
        "materialize it (the collection resumes where it stopped)."
    )


def require_partition(context: dg.AssetExecutionContext, version: str, kept: str) -> None:
    """Raise ``dagster.Failure`` (not retried) with :func:`deleted_message` when partition
    ``version`` was deleted while this run materialized it."""
    message = deleted_message(context, version, kept)
    if message:
        raise dg.Failure(description=message, allow_retries=False)
