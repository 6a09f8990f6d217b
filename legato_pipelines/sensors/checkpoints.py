"""``checkpoint_sensor``: a new policy version appears -> add its partition, run ``collect_job``.

Each evaluation asks the checkpoint source once (a directory listing, or one ``/v1/models``
call), compares with the cursor (the JSON list of versions already requested) and, for every
new version, adds the ``policy_version`` partition (when it does not exist yet) and requests
one run with ``run_key=<version>``. The cursor and the run key both make a version run once:
a second evaluation requests nothing, and Dagster drops a repeated run key even if the cursor
was reset. Versions are requested oldest first; at most ``MAX_PER_TICK`` per evaluation (the
rest on the next ones), so a directory of 1,000 old checkpoints never floods the queue at once.

Folders that match but are not ready (no ready marker yet, or incomplete: a file still
being written, an index naming missing shards) are named in the skip reason ("waiting: step-3
(no READY marker yet)") and requested once they are ready. Each run carries the version's
folder as tag ``legato/checkpoint``: ``rollout_batch`` loads it into the server (the policy
resource's ``load``) before any desktop starts.
"""

import json

import dagster as dg

from ..assets import collect_job, policy_versions
from ..assets.collection import rollout_batch
from ..resources import CheckpointSourceResource, PolicyResource

MAX_PER_TICK = 25
MINIMUM_INTERVAL_S = 30
MAX_WAITING_SHOWN = 5


def _cursor(raw: str | None) -> set[str]:
    if not raw:
        return set()
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return set()
    return set(value) if isinstance(value, list) else set()


def _waiting(waiting: list[tuple[str, str]]) -> str:
    """``"waiting: step-3 (no READY marker yet), step-4 (still being written (x.tmp))"`` (at most
    :data:`MAX_WAITING_SHOWN` named), or ``""`` when nothing waits."""
    if not waiting:
        return ""
    shown = ", ".join(f"{name} ({why})" for name, why in waiting[:MAX_WAITING_SHOWN])
    more = (
        f" and {len(waiting) - MAX_WAITING_SHOWN} more" if len(waiting) > MAX_WAITING_SHOWN else ""
    )
    return f"waiting: {shown}{more}"


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
    seen = _cursor(context.cursor)
    try:
        found, waiting = checkpoints.scan(policy, known=seen)
    except FileNotFoundError:
        return dg.SkipReason(f"checkpoints directory {checkpoints.directory!r} does not exist yet")
    except ValueError as exc:  # not configured (no LEGATO_CHECKPOINTS): say so on every tick
        return dg.SkipReason(str(exc))
    new = [c for c in found if c.version not in seen][:MAX_PER_TICK]
    waiting_text = _waiting(waiting)
    if not new:
        if waiting_text:
            return dg.SkipReason(f"{waiting_text} ({len(found)} known)")
        return dg.SkipReason(f"no new policy version ({len(found)} known)")
    if waiting_text:
        context.log.info(waiting_text)
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
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[policy_versions.build_add_request(to_add)] if to_add else [],
        cursor=json.dumps(sorted(seen | {c.version for c in new})),
    )
