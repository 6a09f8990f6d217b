"""``checkpoint_sensor``: a new policy version appears -> add its partition, run ``collect_job``.

Each evaluation asks the checkpoint source once (a directory listing, or one ``/v1/models``
call), compares with the cursor and, for every new version, adds the ``policy_version``
partition (when it does not exist yet) and requests one run with ``run_key=<version>``. The
cursor and the run key both make a version run once: a second evaluation requests nothing, and
Dagster drops a repeated run key even if the cursor was reset. Versions are requested oldest
first; at most ``MAX_PER_TICK`` per evaluation (the rest on the next ones), so a directory of
1,000 old checkpoints never floods the queue at once.

The cursor is JSON ``{"requested": [versions], "sizes": {folder: size signature}}`` (a bare
list, the older form, is read as ``requested``): ``sizes`` holds the complete folders whose
files were still changing, so a folder counts once its sizes are the same on two ticks in a
row (:mod:`legato_pipelines.resources.checkpoints`: a folder whose files all changed longer
ago than ``stable_s`` counts at once).

Folders that match but do not count yet (no ready marker, incomplete: a file still being
written, an index naming missing shards; sizes not yet stable) are named in the skip reason
("waiting: step-3 (no READY marker yet)") and requested once they count. A folder or model id
that cannot be a version key (``step-5_lr=3e-6``) is skipped with its reason and the key to
rename it to ("skipped: ..."), every tick, while the other versions go on. Each run carries the
version's folder as tag ``legato/checkpoint``: ``rollout_batch`` loads it into the server (the
policy resource's ``load``) before any desktop starts.
"""

import json

import dagster as dg

from ..assets import collect_job, policy_versions
from ..assets.advice import dagster_advice
from ..assets.collection import rollout_batch
from ..resources import CheckpointSourceResource, PolicyResource

MAX_PER_TICK = 25
MINIMUM_INTERVAL_S = 30
MAX_WAITING_SHOWN = 5


def _cursor(raw: str | None) -> tuple[set[str], dict[str, str]]:
    """``(requested versions, sizes)`` from the cursor; nothing from a missing or bad one."""
    if not raw:
        return set(), {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return set(), {}
    if isinstance(value, list):  # the older cursor: the requested versions only
        return {v for v in value if isinstance(v, str)}, {}
    if not isinstance(value, dict):
        return set(), {}
    requested = value.get("requested")
    sizes = value.get("sizes")
    return (
        {v for v in requested if isinstance(v, str)} if isinstance(requested, list) else set(),
        {k: v for k, v in sizes.items() if isinstance(v, str)} if isinstance(sizes, dict) else {},
    )


def _dump(requested: set[str], sizes: dict[str, str]) -> str:
    return json.dumps({"requested": sorted(requested), "sizes": dict(sorted(sizes.items()))})


def _named(label: str, items: list[tuple[str, str]]) -> str:
    """``"<label>: step-3 (no READY marker yet), step-4 (...)"`` (at most
    :data:`MAX_WAITING_SHOWN` named), or ``""`` when there are none."""
    if not items:
        return ""
    shown = ", ".join(f"{name} ({why})" for name, why in items[:MAX_WAITING_SHOWN])
    more = f" and {len(items) - MAX_WAITING_SHOWN} more" if len(items) > MAX_WAITING_SHOWN else ""
    return f"{label}: {shown}{more}"


@dg.sensor(
    job=collect_job,
    minimum_interval_seconds=MINIMUM_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="New checkpoint folder (step-*) or model id -> new policy_version partition and one collect_job run.",
)
def checkpoint_sensor(
    context: dg.SensorEvaluationContext,
    checkpoints: CheckpointSourceResource,
    policy: PolicyResource,
) -> dg.SensorResult | dg.SkipReason:
    seen, sizes = _cursor(context.cursor)
    try:
        scan = checkpoints.scan(policy, known=seen, sizes=sizes)
    except FileNotFoundError:
        return dg.SkipReason(f"checkpoints directory {checkpoints.directory!r} does not exist yet")
    except ValueError as exc:  # not configured (no LEGATO_CHECKPOINTS), or the policy server
        # refused / cannot be reached (the models source): the CLI's message, on every tick
        return dg.SkipReason(dagster_advice(str(exc)))
    found = scan.ready
    new = [c for c in found if c.version not in seen][:MAX_PER_TICK]
    notes = "; ".join(
        text for text in (_named("waiting", scan.waiting), _named("skipped", scan.refused)) if text
    )
    if not new:
        reason = f"{notes or 'no new policy version'} ({len(found)} known)"
        if scan.sizes != sizes:  # sizes recorded: the next tick compares with them
            return dg.SensorResult(skip_reason=reason, cursor=_dump(seen, scan.sizes))
        return dg.SkipReason(reason)
    if scan.waiting:
        context.log.info(_named("waiting", scan.waiting))
    if scan.refused:
        context.log.warning(_named("skipped", scan.refused))
    existing = set(context.instance.get_dynamic_partitions(policy_versions.name))
    to_add = [c.version for c in new if c.version not in existing]
    requests = []
    for c in new:
        tags = {"legato/policy_version": c.version}
        if c.path:
            tags["legato/checkpoint"] = c.path
        run_config = {}
        if c.model:
            tags["legato/model"] = c.model
            run_config = {"ops": {rollout_batch.op.name: {"config": {"model": c.model}}}}
        requests.append(
            dg.RunRequest(
                partition_key=c.version, run_key=c.version, run_config=run_config, tags=tags
            )
        )
    context.log.info(f"new policy versions: {', '.join(c.version for c in new)}")
    requested = seen | {c.version for c in new}
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[policy_versions.build_add_request(to_add)] if to_add else [],
        cursor=_dump(requested, {k: v for k, v in scan.sizes.items() if k not in requested}),
    )
