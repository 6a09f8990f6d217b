"""The lake assets downstream of ``rollout_batch``, same partition: ``rollouts`` (tables
``rollouts`` and ``steps``), ``training_samples`` (table ``samples``), ``profile_summary``
(table ``profile``). Each writes its Parquet partition atomically, then rebuilds the DuckDB
views (:meth:`~legato_pipelines.store.lake.Lake.refresh_views`, under the lake's lock).

Lineage: the rows' ``run_id`` is the Dagster run that materialized ``rollout_batch`` for the
partition (the collection), found in the instance's event log; ``collect_run_id`` the run that
collected each attempt (the records' ``collected_by``: a re-executed partition keeps the run
that collected what it resumed); the served model, checkpoint folder, fingerprint, load mode
and proof come from ``run.json``. The run directory is the one that materialization recorded (``run_dir``
metadata), else ``<lake>/runs/policy_version=<key>``.
"""

import os
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import orjson
from pydantic import Field

from .. import export_steps, profile
from ..errors import ConfigError, LegatoError
from ..resources import LakeResource
from ..store.export import incomplete_groups
from ..store.lake import Lake
from ..store.lake_tables import Lineage, profile_table, rollouts_table, samples_table, steps_table
from ..store.rundir import SUMMARY, read_meta, read_typed_records
from ..trainer.gap import DEFAULT_MAX_MEAN_ABS, version_gap
from . import checks
from .charts import markdown_image, success_by_task, success_chart, time_share_chart
from .collection import GROUP, rollout_batch
from .insight import across_versions_metadata, report_metadata, training_signal
from .metadata import counts_markdown, number, table_metadata
from .partitions import partition_version, policy_versions, require_partition


@dataclass(frozen=True, slots=True)
class Batch:
    """The collection behind a partition: its run directory and lineage."""

    run_dir: Path
    lineage: Lineage


def _not_written(context: dg.AssetExecutionContext, lake: Lake, version: str) -> None:
    """Fail before writing when the partition was deleted mid-run (:func:`require_partition`)."""
    require_partition(
        context,
        version,
        f"Nothing was written by this step; the run directory {lake.run_location(version)} is kept.",
    )


def find_batch(instance: dg.DagsterInstance, version: str, lake: Lake, run_id: str) -> Batch:
    """The run directory and lineage of ``rollout_batch`` for partition ``version``: the
    latest materialization's run id and ``run_dir``; ``run_id`` and the lake's run directory
    when there is none (e.g. a direct asset invocation in a test).

    Raises ``ConfigError`` when the directory is not a run of this policy version (e.g.
    ``rollout_batch`` was never materialized for it)."""
    run_dir = lake.pull_run(version)  # a URL lake: fetched when this host lacks it
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=rollout_batch.key, asset_partitions=[version]), limit=1
    ).records
    if records:
        run_id = records[0].run_id
        recorded = records[0].asset_materialization.metadata.get("run_dir")
        if recorded is not None and not lake.remote:
            run_dir = Path(recorded.value)
    meta = read_meta(run_dir)
    if (meta.get("policy") or {}).get("version") != version:
        raise ConfigError(
            f"{run_dir} holds policy version {(meta.get('policy') or {}).get('version')!r}, not {version!r} "
            "(fix: materialize rollout_batch for this partition first)"
        )
    return Batch(run_dir, Lineage.of_run(version, meta, run_id))


def _summary(batch: Batch) -> dict:
    """The batch's ``summary.json`` (the session's wall time), else recomputed from records."""
    path = batch.run_dir / SUMMARY
    return orjson.loads(path.read_bytes()) if path.is_file() else profile(batch.run_dir)


@dg.asset(
    partitions_def=policy_versions,
    deps=[rollout_batch],
    group_name=GROUP,
    kinds={"parquet", "duckdb"},
    description="Lake tables `rollouts` (one row per execution record) and `steps` (one row per step).",
    check_specs=[checks.NO_ATTEMPT_UNACCOUNTED],
)
def rollouts(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
    store = lake.lake
    batch = find_batch(context.instance, partition_version(context), store, context.run.run_id)
    records = read_typed_records(batch.run_dir)
    table = rollouts_table(records, batch.lineage)
    steps = steps_table(records, batch.lineage)
    _not_written(context, store, batch.lineage.policy_version)
    path = store.write("rollouts", batch.lineage.policy_version, table)
    steps_path = store.write("steps", batch.lineage.policy_version, steps)
    store.refresh_views()
    counts: dict[str, int] = {}
    for status in table.column("status").to_pylist():
        counts[status] = counts.get(status, 0) + 1
    return dg.MaterializeResult(
        metadata={
            **table_metadata(
                table,
                path,
                ["rollout_id", "task_id", "attempt", "status", "reward", "n_steps", "total_s"],
            ),
            "counts": dg.MetadataValue.md(counts_markdown(counts)),
            **report_metadata(batch.run_dir, records),
            "steps_rows": steps.num_rows,
            "steps_path": dg.MetadataValue.path(str(steps_path)),
            "duckdb": dg.MetadataValue.path(str(store.duckdb_path)),
            "collection_run_id": batch.lineage.run_id,
        },
        check_results=[checks.no_attempt_unaccounted(table, _summary(batch).get("scheduled"))],
    )


class SamplesConfig(dg.Config):
    logprobs_floor: float = Field(
        default=checks.DEFAULT_LOGPROBS_FLOOR,
        ge=0,
        le=1,
        description="Minimum share of samples with logprobs and with token ids (LEGATO_LOGPROBS_FLOOR).",
    )
    gap_model: str = Field(
        default=os.environ.get("LEGATO_GAP_MODEL", ""),
        description="Full-weights folder the train_inference_gap check recomputes logprobs with (LEGATO_GAP_MODEL; the check exists only when that is set).",
    )
    gap_python: str = Field(
        default=os.environ.get("LEGATO_GAP_PYTHON", ""),
        description="Interpreter with torch and transformers for the gap check (LEGATO_GAP_PYTHON; default: the code location's).",
    )
    gap_rows: int = Field(default=8, ge=1, description="Rows the gap check recomputes.")
    gap_max_mean_abs: float = Field(
        default=DEFAULT_MAX_MEAN_ABS,
        ge=0,
        description="The gap check fails above this mean |dlogp| [nats].",
    )


def _gap_specs() -> list[dg.AssetCheckSpec]:
    """The optional gap check: declared only when ``LEGATO_GAP_MODEL`` names a model."""
    return [checks.TRAIN_INFERENCE_GAP] if os.environ.get("LEGATO_GAP_MODEL") else []


def _gap_result(config: SamplesConfig, store: Lake, version: str) -> dg.AssetCheckResult:
    try:
        report = version_gap(
            store,
            version,
            config.gap_model,
            rows=config.gap_rows,
            python=config.gap_python or None,
        )
    except (LegatoError, OSError) as exc:  # mismatched model files, no torch, no model
        return dg.AssetCheckResult(
            check_name=checks.TRAIN_INFERENCE_GAP.name,
            passed=False,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={"error": str(exc), "model": config.gap_model},
        )
    return checks.train_inference_gap(report, config.gap_max_mean_abs)


@dg.asset(
    partitions_def=policy_versions,
    deps=[rollout_batch],
    group_name=GROUP,
    kinds={"parquet", "duckdb"},
    check_specs=[checks.LOGPROBS_COVERAGE, checks.ADVANTAGES_CENTERED, *_gap_specs()],
    description="Lake table `samples`: one training row per step of ok/truncated rollouts (token ids, logprobs, reward, GRPO advantage; null with group_complete false for a group short of attempts).",
)
def training_samples(
    context: dg.AssetExecutionContext, config: SamplesConfig, lake: LakeResource
) -> dg.MaterializeResult:
    store = lake.lake
    batch = find_batch(context.instance, partition_version(context), store, context.run.run_id)
    collected_by = {r.rollout_id: r.collected_by for r in read_typed_records(batch.run_dir)}
    table = samples_table(export_steps(batch.run_dir), batch.lineage, collected_by)
    _not_written(context, store, batch.lineage.policy_version)
    path = store.write("samples", batch.lineage.policy_version, table)
    store.refresh_views()
    with_logprobs = sum(1 for v in table.column("response_logprobs").to_pylist() if v)
    return dg.MaterializeResult(
        metadata={
            **table_metadata(
                table,
                path,
                [
                    "rollout_id",
                    "task_id",
                    "step",
                    "reward",
                    "advantage",
                    "response_token_ids",
                    "response_text",
                ],
            ),
            "rollouts": len(set(table.column("rollout_id").to_pylist())),
            # groups with fewer graded attempts than collected for: no advantage in their rows
            "incomplete_groups": incomplete_groups(table),
            "logprobs_share": number(with_logprobs / table.num_rows if table.num_rows else None),
            **training_signal(read_typed_records(batch.run_dir), table),
            "duckdb": dg.MetadataValue.path(str(store.duckdb_path)),
            "collection_run_id": batch.lineage.run_id,
        },
        check_results=[
            checks.logprobs_coverage(table, config.logprobs_floor),
            checks.advantages_centered(table),
            *([_gap_result(config, store, batch.lineage.policy_version)] if _gap_specs() else []),
        ],
    )


@dg.asset(
    partitions_def=policy_versions,
    deps=[rollout_batch],
    group_name=GROUP,
    kinds={"parquet", "duckdb"},
    description="Lake table `profile`: the batch's summary (success, throughput, time share, model-call latency, coverage).",
    check_specs=[checks.SUCCESS_RATE_REPORTED],
)
def profile_summary(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
    store = lake.lake
    batch = find_batch(context.instance, partition_version(context), store, context.run.run_id)
    summary = _summary(batch)
    table = profile_table(summary, batch.lineage)
    version = batch.lineage.policy_version
    _not_written(context, store, version)
    path = store.write("profile", version, table)
    store.refresh_views()
    time_share = summary.get("time_share") or {}
    records = read_typed_records(batch.run_dir)
    per_task = success_by_task(records)
    charts = {}
    if time_share:
        png = time_share_chart(time_share, f"Time share by phase, {version}")
        store.write_chart(version, "time_share.png", png)
        charts["time_share_chart"] = dg.MetadataValue.md(markdown_image(png, "time share by phase"))
    if per_task:
        png = success_chart(per_task, f"Success by task, {version}")
        store.write_chart(version, "success_by_task.png", png)
        charts["success_by_task_chart"] = dg.MetadataValue.md(
            markdown_image(png, "success by task")
        )
    charts.update(across_versions_metadata(store, version, records))
    if charts:  # the PNGs behind the images, outside the table's folder
        charts["charts"] = dg.MetadataValue.path(str(store.chart_dir(version)))
    calls = summary.get("model_call_s") or {}
    return dg.MaterializeResult(
        metadata={
            **table_metadata(
                table,
                path,
                ["policy_version", "records", "success_rate", "rollouts_per_hour", "wall_s"],
            ),
            "success_rate": number(summary.get("success_rate")),
            "rollouts_per_hour": number(summary.get("rollouts_per_hour")),
            "model_call_p50_s": number(calls.get("p50")),
            "model_call_p95_s": number(calls.get("p95")),
            "prefix_cache_hit_rate": number(summary.get("prefix_cache_hit_rate")),
            "time_share": dg.MetadataValue.json(
                {k: round(float(v), 4) for k, v in time_share.items()}
            ),
            **charts,
            "duckdb": dg.MetadataValue.path(str(store.duckdb_path)),
            "collection_run_id": batch.lineage.run_id,
        },
        check_results=[checks.success_rate_reported(summary)],
    )
