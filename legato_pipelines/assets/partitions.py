"""The partitioning of every asset: one dynamic partition per policy version.

Keys are added by the checkpoint sensor (a new ``step-*`` checkpoint or model id), by
``legato demo``, or by hand (``dagster asset materialize --partition`` needs it to exist:
``DagsterUnknownPartitionError`` otherwise). Keys follow
:func:`~legato_pipelines.versions.check_version_key`: the sensor and ``legato demo`` add only
such keys; a key added by hand (the UI, ``add_dynamic_partitions``) is checked when a run
materializes it (:func:`partition_version`), before anything is collected or written.
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
