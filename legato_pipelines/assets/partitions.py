"""The partitioning of every asset: one dynamic partition per policy version.

Keys are added by the checkpoint sensor (a new ``step-*`` checkpoint or model id), by
``legato demo``, or by hand (``dagster asset materialize --partition`` needs it to exist:
``DagsterUnknownPartitionError`` otherwise). Keys follow
:func:`~legato_pipelines.store.lake.check_partition_key`.
"""

from __future__ import annotations

import dagster as dg

POLICY_VERSION = "policy_version"

policy_versions = dg.DynamicPartitionsDefinition(name=POLICY_VERSION)
"""Dynamic partitions ``policy_version`` (keep well under 100,000 keys: Dagster's limit)."""
