"""``rollout_batch``: collect one batch for one policy version (the partition key).

Thin: it turns resources and run config into one :func:`legato_pipelines.collect` call into
the partition's run directory (``<lake>/runs/policy_version=<key>``; materializing the same
partition again resumes it) and reports what happened as metadata. The ``legato_collection``
pool limits how many collections run at once (``concurrency.pools.default_limit`` in
``dagster.yaml`` for every pool, or ``dagster instance concurrency set legato_collection N``).
Two ``weights`` runs on one server take turns by themselves (the server's weights lock,
:mod:`legato_pipelines.policy.servers`).

Before any desktop starts, the version's checkpoint (the run's ``legato/checkpoint`` tag, set
by the checkpoint sensor, else ``<policy.checkpoint_root>/<version>``) is loaded into the
server or verified there, as the policy resource's ``load`` says
(:mod:`legato_pipelines.policy.loading`). The run's tags say how it went: ``legato/load`` is
``<mode>: loaded`` / ``verified`` / ``not checked``, or ``failed`` with ``legato/load_error``
(the server's answer), so a checkpoint that failed to load is visible on the run itself.

A batch whose groups did not all close (attempts ended in error: a policy-server outage,
desktops lost) fails the asset with ``dagster.Failure`` saying how many groups are incomplete
and the errors by kind, as ``legato collect`` exits 1: the records are kept, and materializing
the partition again resumes it, re-running those attempts.

A partition deleted while it is being collected ends the step without a materialization and
without a stack trace: the records stay in the run directory, the run's log says so and names
``legato lake drop VERSION``, its tag ``legato/partition`` is ``deleted mid-run``, and the
run's later steps (the lake tables) are skipped.
"""

from collections.abc import Iterator

import dagster as dg

from .. import collect, load_tasks
from ..errors import ConfigError, LoadError
from ..resources import DesktopPoolResource, LakeResource, PolicyResource
from ..rollout.profile import incomplete_message
from .advice import in_dagster
from .config import CollectConfig
from .metadata import counts_markdown, number
from .partitions import deleted_message, partition_version, policy_versions

COLLECTION_POOL = "legato_collection"
GROUP = "legato"
PROGRESS_EVERY = 25
"""Log a progress line every this many records."""
CHECKPOINT_TAG = "legato/checkpoint"
"""Run tag naming the version's checkpoint folder (set by the checkpoint sensor)."""
LOAD_TAG = "legato/load"
LOAD_ERROR_TAG = "legato/load_error"
PARTITION_TAG = "legato/partition"
"""Run tag set to ``deleted mid-run`` when the partition was deleted while collecting."""
_LOAD_DONE = {"none": "not checked", "lora": "loaded", "weights": "loaded", "external": "verified"}


@dg.asset(
    partitions_def=policy_versions,
    pool=COLLECTION_POOL,
    group_name=GROUP,
    kinds={"python"},
    description="One collected batch for a policy version: graded attempts in the partition's run directory.",
    output_required=False,  # none when the partition was deleted mid-run (module doc)
)
def rollout_batch(
    context: dg.AssetExecutionContext,
    config: CollectConfig,
    policy: PolicyResource,
    desktops: DesktopPoolResource,
    lake: LakeResource,
) -> Iterator[dg.MaterializeResult]:
    """Collect ``config.group`` attempts per task of ``config.tasks`` with the policy at version
    ``partition_key``. Raises the engine's ``ConfigError``/``PolicyConfigError`` (bad task list,
    wrong URL or model, no LEGATO_POLICY_URL) before any desktop starts; every engine error's
    message also names the Dagster setting to change (:mod:`.advice`). Raises
    ``dagster.Failure`` after the batch when groups are left open by errors (materializing the
    partition again resumes them). Yields its materialization, or nothing when the partition
    was deleted while collecting (the records are kept; the log says so and names
    ``legato lake drop``)."""
    version = partition_version(context)  # checked first: it names folders and adapters
    with in_dagster("rollout_batch run config"):
        settings = config.settings(desktops=desktops.count())
    with in_dagster("policy"):
        task_set = load_tasks(config.tasks, osworld=desktops.osworld)
        policy_config = policy.config(version, model=config.model)
        load = policy.load_spec(
            version,
            context.run.tags.get(CHECKPOINT_TAG),
            # the models source calls a model id ("team/step-40"): that is the name to check,
            # not the partition key made from it ("team--step-40")
            adapter=config.adapter or config.model,
        )
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
                settings=settings,
                desktop=desktops.config(),
                osworld=desktops.osworld,
                on_record=progress,
                load=load,
                collected_by=context.run.run_id,
            )
    except LoadError as exc:
        _tag_load_failure(context, load.mode, str(exc))
        raise
    finally:
        store.push_run(version)  # a URL lake: upload what was collected, even after a failure
    gone = deleted_message(
        context,
        version,
        f"What was collected is kept: {summary.get('records', 0)} records in "
        f"{store.run_location(version)}; nothing was written to the lake's tables.",
    )
    if gone:  # Dagster cannot store a materialization of a deleted partition: none, no trace
        context.log.error(gone)
        context.instance.add_run_tags(context.run.run_id, {PARTITION_TAG: "deleted mid-run"})
        return
    served = _served(run_dir)
    context.instance.add_run_tags(
        context.run.run_id, {LOAD_TAG: f"{load.mode}: {_LOAD_DONE[load.mode]}"}
    )
    counts = summary.get("counts") or {}
    metadata = {
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
        "load": load.mode,
        "served_model": served.get("served_model") or policy_config.model,
        "checkpoint": dg.MetadataValue.path(served["path"]) if served.get("path") else "n/a",
        "checkpoint_fingerprint": served.get("fingerprint") or "n/a",
        "load_proof": dg.MetadataValue.json(served.get("proof") or {}),
    }
    problem = incomplete_message(summary)
    if problem:  # groups left open by errors: not a batch; materializing again resumes them
        raise dg.Failure(
            description=problem.replace(
                "run the same command again", "materialize this partition again"
            ),
            metadata=metadata | {"incomplete": dg.MetadataValue.json(summary["incomplete"])},
        )
    yield dg.MaterializeResult(metadata=metadata)


def _served(run_dir) -> dict:
    """``run.json``'s ``checkpoint`` entry (mode, served model, folder, fingerprint, proof)."""
    from ..store.rundir import read_meta

    try:
        return read_meta(run_dir).get("checkpoint") or {}
    except ConfigError:
        return {}


def _tag_load_failure(context: dg.AssetExecutionContext, mode: str, message: str) -> None:
    """Mark the run: its checkpoint failed to load (tags ``legato/load`` = ``failed`` and
    ``legato/load_error``, the server's answer cut to 500 characters) and log it as an error."""
    context.log.error(f"checkpoint load failed ({mode}): {message}")
    context.instance.add_run_tags(
        context.run.run_id, {LOAD_TAG: f"{mode}: failed", LOAD_ERROR_TAG: message[:500]}
    )
