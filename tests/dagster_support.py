"""Shared pieces of the Dagster tests: one tick of the checkpoint sensor, as the daemon runs it."""

from __future__ import annotations

import dagster as dg

from legato_pipelines.sensors import checkpoint_sensor


def sensor_tick(instance, cursor, checkpoints, policy):
    """Evaluate ``checkpoint_sensor`` once with these resources and add the partitions it
    requests to ``instance`` (what the daemon does with the result); returns the result."""
    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"checkpoints": checkpoints, "policy": policy}
    )
    result = checkpoint_sensor(context)
    if isinstance(result, dg.SensorResult):
        for request in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(
                request.partitions_def_name, list(request.partition_keys)
            )
    return result
