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


def launch_request(
    instance, request, policy, lake_root, desktops, run_config, raise_on_error=True
) -> dg.ExecuteInProcessResult:
    """Materialize what a sensor's ``request`` (a ``RunRequest``) asks for, with its tags, as
    the daemon would launch it: the assets with ``policy``, ``desktops`` (a
    ``DesktopPoolResource``) and a lake at ``lake_root``."""
    from legato_pipelines.assets import ASSETS
    from legato_pipelines.resources import LakeResource

    return dg.materialize(
        ASSETS,
        partition_key=request.partition_key,
        instance=instance,
        tags=request.tags,
        resources={
            "policy": policy,
            "desktops": desktops,
            "lake": LakeResource(root=str(lake_root)),
        },
        run_config=run_config,
        raise_on_error=raise_on_error,
    )
