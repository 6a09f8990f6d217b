"""``rollout_batch``: collect one batch for one policy version (the partition key).

Thin: it turns resources and run config into one :func:`legato_pipelines.collect` call into
the partition's run directory (``<lake>/runs/policy_version=<key>``; materializing the same
partition again resumes it) and reports what happened as metadata. The ``legato_collection``
pool limits how many collections run at once (``concurrency.pools`` in ``dagster.yaml``).
"""

import dagster as dg

from .. import collect, load_tasks
from ..resources import DesktopPoolResource, LakeResource, PolicyResource
from .advice import in_dagster
from .config import CollectConfig
from .metadata import counts_markdown, number
from .partitions import policy_versions

COLLECTION_POOL = "legato_collection"
GROUP = "legato"
PROGRESS_EVERY = 25
"""Log a progress line every this many records."""


@dg.asset(
    partitions_def=policy_versions,
    pool=COLLECTION_POOL,
    group_name=GROUP,
    kinds={"python"},
    description="One collected batch for a policy version: graded attempts in the partition's run directory.",
)
def rollout_batch(
    context: dg.AssetExecutionContext,
    config: CollectConfig,
    policy: PolicyResource,
    desktops: DesktopPoolResource,
    lake: LakeResource,
) -> dg.MaterializeResult:
    """Collect ``config.group`` attempts per task of ``config.tasks`` with the policy at version
    ``partition_key``. Raises the engine's ``ConfigError``/``PolicyConfigError`` (bad task list,
    wrong URL or model, no LEGATO_POLICY_URL) before any desktop starts; every engine error's
    message also names the Dagster setting to change (:mod:`.advice`)."""
    version = context.partition_key
    with in_dagster("policy"):
        task_set = load_tasks(config.tasks, osworld=desktops.osworld)
        policy_config = policy.config(version, model=config.model)
    store = lake.lake
    run_dir = store.pull_run(version)  # a URL lake: its copy, to resume on any worker host
    seen = 0

    def progress(record: dict) -> None:
        nonlocal seen
        seen += 1
        if seen % PROGRESS_EVERY == 0:
            context.log.info(
                f"{seen} records; last: {record['task_id']} attempt {record['attempt']} {record['status']}"
            )

    context.log.info(
        f"collecting {len(task_set)} tasks x {config.group} (task set {task_set.task_set}) with {policy_config.model} "
        f"at version {version} on {desktops.count()} {desktops.backend} desktops into {run_dir}"
    )
    try:
        with in_dagster("collect"), policy.credentials():
            summary = collect(
                task_set,
                policy_config,
                run_dir,
                settings=config.settings(desktops=desktops.count()),
                desktop=desktops.config(),
                osworld=desktops.osworld,
                on_record=progress,
            )
    finally:
        store.push_run(version)  # a URL lake: upload what was collected, even after a failure
    counts = summary.get("counts") or {}
    return dg.MaterializeResult(
        metadata={
            "policy_version": version,
            "model": policy_config.model,
            "task_set": task_set.task_set,
            "tasks_path": dg.MetadataValue.path(task_set.path or config.tasks),
            "tasks": len(task_set),
            "knobs": dg.MetadataValue.json(summary.get("knobs") or {}),
            "counts": dg.MetadataValue.md(counts_markdown(counts)),
            "dagster/row_count": int(summary.get("records") or 0),
            "scheduled": int(summary.get("scheduled") or 0),
            "missing": int(summary.get("missing") or 0),
            "success_rate": number(summary.get("success_rate")),
            "rollouts_per_hour": number(summary.get("rollouts_per_hour")),
            "wall_s": number(summary.get("wall_s")),
            "desktops": dg.MetadataValue.json(summary.get("desktops") or {}),  # lost/recovered
            "run_dir": dg.MetadataValue.path(str(store.run_location(version))),
        }
    )
