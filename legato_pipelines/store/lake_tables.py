"""The lake's tables as Arrow: rows built from a run directory's records, export and summary.

Four tables, one Parquet partition per policy version each (docs/architecture.md §7):

``rollouts``  one row per execution record of ``rollouts.jsonl`` (every status, retried and
              errors included), with its timing per phase and token totals
``steps``     one row per step of every record: action, model-call numbers, waits
``samples``   :func:`~legato_pipelines.export_steps` (one row per step of ``ok``/``truncated``
              rollouts: messages, response token ids, logprobs, reward, GRPO advantage)
``profile``   one row per policy version: the run's ``summary.json`` flattened

Every row carries its lineage: ``policy_version``, ``task_set``, ``run_id`` (the Dagster run
that materialized the partition's collection last), ``served_model`` (the model id the batch
called), ``checkpoint_path`` and ``checkpoint_fingerprint`` (the version's folder and its
fingerprint, null when the batch had none), ``load_mode`` (``none`` | ``lora`` | ``weights`` |
``external``; null for a run from before loading existed) and ``load_proof`` (what showed the
server served that folder: ``models_listing``, ``loaded_adapters``, ``model_path``,
``route_reported_path``, ``route_answer``, ``load_answer``; ``none`` under load ``none``, where
``checkpoint_path`` and ``checkpoint_fingerprint`` are what the run was told, not what the
server was shown to serve; ``changed`` when the check after collecting found other weights
served: ``WHERE load_proof NOT IN ('none', 'changed')`` keeps proven rows) and ``rollout_id`` (``profile`` rows have no
rollout); ``rollouts``, ``steps`` and ``samples`` rows also carry ``collect_run_id``, the run
that collected that attempt (a re-executed partition keeps it; ``run_id`` when the record
does not say), and ``policy_step``, the training step the version key carries (null when
none), to sort versions by. The schemas are fixed here, so partitions written at different
times union cleanly (a column that is null in one batch keeps its type; the views union by
name).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from ..record import PHASES, STATUSES, Record, as_record
from ..versions import version_step
from .export import run_weights, sample_schema, step_quality

# PHASES: timing phases of a record (``timing.<phase>_s``), in the order an attempt runs them.
# STATUSES: record statuses (docs/architecture.md §3); ``profile`` has one ``count_<status>``
# column each.


@dataclass(frozen=True, slots=True)
class Lineage:
    """What every lake row is tied to: the policy version (the partition key), the task set
    id, the Dagster run id of the collection, and the weights: the served model id, the
    checkpoint folder and its fingerprint, the load mode and the kind of proof (``None`` when
    unknown; module doc)."""

    policy_version: str
    task_set: str
    run_id: str
    served_model: str | None = None
    checkpoint_path: str | None = None
    checkpoint_fingerprint: str | None = None
    load_mode: str | None = None
    load_proof: str | None = None

    @classmethod
    def of_run(cls, version: str, meta: Mapping[str, Any], run_id: str) -> Lineage:
        """The lineage a run directory's ``run.json`` gives (``meta``) for ``version``."""
        return cls(version, meta["task_set"], run_id, **run_weights(meta))

    def columns(self, n: int) -> dict[str, pa.Array]:
        """The lineage columns for ``n`` rows: the ids, the weights (served model, checkpoint
        path and fingerprint), and ``policy_step``, the training step the version key carries
        (``step-50`` -> 50; null when it carries none), so SQL sorts versions in training order
        (``ORDER BY policy_step``)."""
        return {
            "policy_version": pa.array([self.policy_version] * n, pa.string()),
            "policy_step": pa.array([version_step(self.policy_version)] * n, pa.int64()),
            "task_set": pa.array([self.task_set] * n, pa.string()),
            "run_id": pa.array([self.run_id] * n, pa.string()),
            "served_model": pa.array([self.served_model] * n, pa.string()),
            "checkpoint_path": pa.array([self.checkpoint_path] * n, pa.string()),
            "checkpoint_fingerprint": pa.array([self.checkpoint_fingerprint] * n, pa.string()),
            "load_mode": pa.array([self.load_mode] * n, pa.string()),
            "load_proof": pa.array([self.load_proof] * n, pa.string()),
        }


_WEIGHTS_FIELDS = [
    pa.field("served_model", pa.string()),
    pa.field("checkpoint_path", pa.string()),
    pa.field("checkpoint_fingerprint", pa.string()),
    pa.field("load_mode", pa.string()),
    pa.field("load_proof", pa.string()),
]
_LINEAGE_FIELDS = [
    pa.field("policy_version", pa.string(), nullable=False),
    pa.field("policy_step", pa.int64()),
    pa.field("task_set", pa.string(), nullable=False),
    pa.field("run_id", pa.string(), nullable=False),
    *_WEIGHTS_FIELDS,
]
_COLLECT_RUN = pa.field("collect_run_id", pa.string())
_TS = pa.timestamp("us", tz="UTC")

#: one step OSWorld carries on after (:class:`~legato_pipelines.record.SetupFailure`)
_STEP_FAILURE = pa.struct(
    [
        pa.field("step", pa.int64()),
        pa.field("type", pa.string()),
        pa.field("exit_status", pa.int64()),
        pa.field("error", pa.string()),
    ]
)

ROLLOUTS_SCHEMA = pa.schema(
    [
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string()),
        pa.field("domain", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("attempt", pa.int32()),
        pa.field("execution", pa.int32()),
        pa.field("status", pa.string()),
        pa.field("outcome", pa.string()),
        pa.field("reward", pa.float64()),
        pa.field("error_kind", pa.string()),
        pa.field("error_type", pa.string()),
        pa.field("error_message", pa.string()),
        pa.field("error_phase", pa.string()),
        pa.field("eval_error", pa.string()),
        pa.field("n_steps", pa.int32()),
        pa.field("desktop", pa.string()),
        pa.field("started_at", _TS),
        pa.field("ended_at", _TS),
        *[pa.field(f"{phase}_s", pa.float64()) for phase in PHASES],
        pa.field("total_s", pa.float64()),
        pa.field("reset_kind", pa.string()),
        pa.field("reset_ready_s", pa.float64()),
        pa.field("reset_critical_s", pa.float64()),  # waited for a ready desktop (issue 18)
        pa.field("reset_ahead", pa.bool_()),  # its desktop was prepared ahead
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("cached_tokens", pa.int64()),
        pa.field("model", pa.string()),
        pa.field("truncation", pa.string()),  # why a truncated attempt stopped (context length)
        pa.field("eval_notes", pa.list_(pa.string())),  # facts explaining the reward
        # the evaluator's postconfig steps OSWorld carries on after (record.SetupFailure)
        pa.field("postconfig_failures", pa.list_(_STEP_FAILURE)),
        pa.field("grader_log", pa.string()),  # the grader's log, relative to the run directory
        *_LINEAGE_FIELDS,
        _COLLECT_RUN,
    ]
)

STEPS_SCHEMA = pa.schema(
    [
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("attempt", pa.int32()),
        pa.field("execution", pa.int32()),
        pa.field("status", pa.string()),
        pa.field("step", pa.int32()),
        pa.field("n_messages", pa.int32()),
        pa.field("response_text", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("has_token_ids", pa.bool_()),
        pa.field("has_logprobs", pa.bool_()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("cached_tokens", pa.int64()),
        pa.field("model_s", pa.float64()),
        pa.field("model_attempts", pa.int32()),
        pa.field("model_timeouts", pa.int32()),
        pa.field("token_ids_source", pa.string()),
        pa.field("action_text", pa.string()),
        pa.field("parse_error", pa.string()),
        pa.field("actions", pa.string()),  # JSON list of the structured actions
        pa.field("n_actions", pa.int32()),
        pa.field("act_s", pa.float64()),
        pa.field("wait_s", pa.float64()),
        pa.field("ready_s", pa.float64()),
        pa.field("obs_s", pa.float64()),
        pa.field("observation", pa.string()),  # image sha of the screen after the step
        # quality of the step's numbers (store/export.py step_quality)
        pa.field("length_mismatch", pa.bool_()),
        pa.field("logprob_sentinels", pa.int32()),
        pa.field("logprobs_valid", pa.bool_()),
        pa.field("reward_valid", pa.bool_()),  # the record's reward is a finite number
        pa.field("has_prompt_token_ids", pa.bool_()),
        *_LINEAGE_FIELDS,
        _COLLECT_RUN,
    ]
)

PROFILE_SCHEMA = pa.schema(
    [
        pa.field("policy_version", pa.string(), nullable=False),
        pa.field("policy_step", pa.int64()),
        pa.field("task_set", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        *_WEIGHTS_FIELDS,
        pa.field("model", pa.string()),
        pa.field("tasks_path", pa.string()),
        pa.field("records", pa.int64()),
        pa.field("scheduled", pa.int64()),
        pa.field("retries", pa.int64()),
        pa.field("missing", pa.int64()),
        pa.field("steps", pa.int64()),
        pa.field("groups_total", pa.int64()),
        pa.field("groups_closed", pa.int64()),
        *[pa.field(f"count_{status}", pa.int64()) for status in STATUSES],
        pa.field("success_rate", pa.float64()),
        pa.field("rollouts_per_hour", pa.float64()),
        pa.field("wall_s", pa.float64()),
        pa.field("time_share", pa.map_(pa.string(), pa.float64())),
        pa.field("model_call_p50_s", pa.float64()),
        pa.field("model_call_p95_s", pa.float64()),
        pa.field("model_call_p99_s", pa.float64()),
        pa.field("retried_calls", pa.int64()),
        pa.field("hung_calls", pa.int64()),
        pa.field("policy_errors", pa.int64()),
        pa.field("env_errors", pa.int64()),
        pa.field("env_failures", pa.int64()),
        pa.field("env_failure_kinds", pa.map_(pa.string(), pa.int64())),  # error type -> count
        pa.field("parse_errors", pa.int64()),
        pa.field(
            "setup_failure_attempts", pa.int64()
        ),  # attempts whose setup carried on past a failure
        # attempts whose evaluator's postconfig carried on past a failure
        pa.field("postconfig_failure_attempts", pa.int64()),
        pa.field("ready_timeouts", pa.int64()),  # actions whose ready wait hit its cap
        pa.field("reset_timeouts", pa.int64()),  # resets whose ready wait hit its cap
        pa.field("eval_note_attempts", pa.int64()),  # graded attempts with evaluator notes
        pa.field("keyboard_restores", pa.int64()),  # resets that restored the keyboard layout
        pa.field("unexpected_window_attempts", pa.int64()),  # popups closed before acting
        pa.field("not_typed_actions", pa.int64()),  # type actions whose text did not all arrive
        pa.field("reset_critical_p50_s", pa.float64()),  # reset on the critical path
        pa.field("reset_critical_p90_s", pa.float64()),
        pa.field("reset_critical_p50_by_domain", pa.map_(pa.string(), pa.float64())),
        pa.field("prefix_cache_hit_rate", pa.float64()),
        pa.field("logprobs_share", pa.float64()),
        pa.field("token_ids_share", pa.float64()),
        pa.field("graded", pa.int64()),  # final attempts with a valid reward
        pa.field("invalid_rewards", pa.int64()),  # executions whose evaluator gave no reward
        pa.field("length_mismatches", pa.int64()),  # steps
        pa.field("logprob_sentinel_steps", pa.int64()),  # steps with sentinel logprobs
        pa.field("server_aborts", pa.int64()),  # calls re-tried after an abort / empty 200
        pa.field("context_length_truncations", pa.int64()),
        pa.field("prompt_token_ids_share", pa.float64()),
        pa.field("temperature", pa.float64()),
        pa.field("top_p", pa.float64()),
        pa.field("max_tokens", pa.int64()),
        pa.field("sampling_seed", pa.int64()),
        pa.field("logprobs_mode", pa.string()),
        pa.field("knobs", pa.string()),  # JSON
        pa.field("summary", pa.string()),  # the whole summary.json, JSON
    ]
)


def samples_schema() -> pa.Schema:
    """Today's schema of the ``samples`` table: the step export's
    (:func:`~legato_pipelines.store.export.sample_schema`), then the lineage columns
    :func:`samples_table` adds (``policy_step``, ``run_id``, ``collect_run_id``)."""
    base = sample_schema()
    extra = [f for f in (*_LINEAGE_FIELDS, _COLLECT_RUN) if f.name not in base.names]
    return pa.schema([*base, *extra])


def _sum(values: Iterable[Any]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return sum(present) if present else None


def _sum_int(values: Iterable[Any]) -> int | None:
    present = [int(v) for v in values if v is not None]
    return sum(present) if present else None


def _ts(value: Any) -> int | None:
    """Unix seconds -> microseconds (Arrow ``timestamp[us]``)."""
    return None if value is None else int(round(float(value) * 1_000_000))


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def rollouts_table(records: Iterable[Record | Mapping[str, Any]], lineage: Lineage) -> pa.Table:
    """One row per execution record (:data:`ROLLOUTS_SCHEMA`); records typed or JSON dicts.

    ``prompt_tokens``/``completion_tokens``/``cached_tokens`` sum the steps' model-call
    counts (``None`` when no step reported them).
    """
    rows: list[dict[str, Any]] = []
    for r in map(as_record, records):
        error, timing, reset = r.error, r.timing, r.reset
        models = [s.model for s in r.steps]
        row = {
            "rollout_id": r.rollout_id,
            "task_id": r.task_id,
            "domain": r.domain,
            "group_id": r.group_id,
            "attempt": r.attempt,
            "execution": r.execution,
            "status": r.status,
            "outcome": r.outcome,
            "reward": r.reward,
            "error_kind": error.kind if error else None,
            "error_type": error.type if error else None,
            "error_message": error.message if error else None,
            "error_phase": error.phase if error else None,
            "eval_error": r.eval_error,
            "n_steps": r.n_steps if "n_steps" in r.model_fields_set else len(r.steps),
            "desktop": r.desktop,
            "started_at": _ts(r.started_at),
            "ended_at": _ts(r.ended_at),
            **{f"{phase}_s": timing.phase(phase) for phase in PHASES},
            "total_s": timing.total_s,
            "reset_kind": reset.kind if reset else None,
            "reset_ready_s": reset.ready_s if reset else None,
            "reset_critical_s": timing.reset_critical_s,
            "reset_ahead": timing.reset_ahead,
            "prompt_tokens": _sum_int(m.prompt_tokens for m in models),
            "completion_tokens": _sum_int(m.completion_tokens for m in models),
            "cached_tokens": _sum_int(m.cached_tokens for m in models),
            "model": r.policy.model,
            "truncation": r.truncation,
            "collect_run_id": r.collected_by or lineage.run_id,
            "eval_notes": r.eval_notes,
            "postconfig_failures": [f.model_dump() for f in r.postconfig_failures]
            if r.postconfig_failures
            else None,
            "grader_log": r.grader_log,
        }
        rows.append(row)
    return _table(rows, ROLLOUTS_SCHEMA, lineage)


def steps_table(records: Iterable[Record | Mapping[str, Any]], lineage: Lineage) -> pa.Table:
    """One row per step of every record (:data:`STEPS_SCHEMA`); ``act_s``/``wait_s``/``ready_s``
    sum the step's actions (``ready_s`` is ``None`` when every wait was fixed)."""
    rows: list[dict[str, Any]] = []
    for r in map(as_record, records):
        reward_valid = r.reward_valid
        for s in r.steps:
            response, model, actions = s.response, s.model, s.actions
            quality = step_quality(s)
            rows.append(
                {
                    "rollout_id": r.rollout_id,
                    "task_id": r.task_id,
                    "group_id": r.group_id,
                    "attempt": r.attempt,
                    "execution": r.execution,
                    "status": r.status,
                    "step": s.step,
                    "n_messages": len(s.request),
                    "response_text": response.content,
                    "finish_reason": response.finish_reason,
                    "has_token_ids": bool(response.token_ids),
                    "has_logprobs": bool(response.logprobs),
                    "prompt_tokens": model.prompt_tokens,
                    "completion_tokens": model.completion_tokens,
                    "cached_tokens": model.cached_tokens,
                    "model_s": model.seconds,
                    "model_attempts": model.attempts,
                    "model_timeouts": model.timeouts,
                    "token_ids_source": model.token_ids_source,
                    "action_text": s.action_text,
                    "parse_error": s.parse_error,
                    "actions": _json([a.to_json_dict() for a in actions]),
                    "n_actions": len(actions),
                    "act_s": _sum(a.act_s for a in actions),
                    "wait_s": _sum(a.wait_s for a in actions),
                    "ready_s": _sum(a.ready_s for a in actions),
                    "obs_s": s.obs_s,
                    "observation": s.observation,
                    "length_mismatch": quality["length_mismatch"],
                    "logprob_sentinels": quality["logprob_sentinels"],
                    "logprobs_valid": quality["logprobs_valid"],
                    "reward_valid": reward_valid,
                    "has_prompt_token_ids": s.prompt_ids is not None,
                    "collect_run_id": r.collected_by or lineage.run_id,
                }
            )
    return _table(rows, STEPS_SCHEMA, lineage)


def samples_table(
    export: pa.Table, lineage: Lineage, collected_by: Mapping[str, str | None] | None = None
) -> pa.Table:
    """The step export with its lineage: ``run_id`` and the weights columns added,
    ``collect_run_id`` per row from ``collected_by`` (rollout_id -> the run that collected it;
    ``run_id`` where it says nothing), ``policy_version``/``task_set`` checked against the
    partition (a mismatch means the run directory belongs to another version: ``ValueError``)."""
    for name in ("policy_version", "task_set"):
        if name in export.column_names:
            values = set(export.column(name).unique().to_pylist())
            expected = getattr(lineage, name)
            if values - {expected}:
                raise ValueError(
                    f"samples: column {name!r} holds {sorted(map(str, values))}, expected only {expected!r} "
                    "(the run directory belongs to another partition)"
                )
    columns = lineage.columns(export.num_rows)
    by = collected_by or {}
    columns["collect_run_id"] = pa.array(
        [by.get(rid) or lineage.run_id for rid in export.column("rollout_id").to_pylist()],
        pa.string(),
    )
    table = export
    for name, array in columns.items():
        if name in table.column_names:
            table = table.set_column(table.schema.get_field_index(name), name, array)
        else:
            table = table.append_column(name, array)
    return table


_QUALITY_COLUMNS = (
    "graded",
    "invalid_rewards",
    "length_mismatches",
    "logprob_sentinel_steps",
    "server_aborts",
    "context_length_truncations",
    "prompt_token_ids_share",
)


def profile_table(summary: Mapping[str, Any], lineage: Lineage) -> pa.Table:
    """One row (:data:`PROFILE_SCHEMA`) from a run's ``summary.json`` / ``profile(run_dir)``."""
    counts = summary.get("counts") or {}
    groups = summary.get("groups") or {}
    calls = summary.get("model_call_s") or {}
    share = summary.get("time_share") or {}
    quality = summary.get("quality") or {}
    critical = summary.get("reset_critical") or {}
    sampling = summary.get("sampling") or {}
    row = {
        "model": (summary.get("policy") or {}).get("model"),
        "tasks_path": summary.get("tasks_path"),
        "records": summary.get("records"),
        "scheduled": summary.get("scheduled"),
        "retries": summary.get("retries"),
        "missing": summary.get("missing"),
        "steps": summary.get("steps"),
        "groups_total": groups.get("total"),
        "groups_closed": groups.get("closed"),
        **{f"count_{status}": int(counts.get(status, 0)) for status in STATUSES},
        "success_rate": summary.get("success_rate"),
        "rollouts_per_hour": summary.get("rollouts_per_hour"),
        "wall_s": summary.get("wall_s"),
        "time_share": [(str(k), float(v)) for k, v in share.items() if v is not None],
        "model_call_p50_s": calls.get("p50"),
        "model_call_p95_s": calls.get("p95"),
        "model_call_p99_s": calls.get("p99"),
        "retried_calls": summary.get("retried_calls"),
        "hung_calls": summary.get("hung_calls"),
        "policy_errors": summary.get("policy_errors"),
        "env_errors": summary.get("env_errors"),
        "env_failures": summary.get("env_failures"),
        "env_failure_kinds": [
            (str(k), int(v)) for k, v in (summary.get("env_failure_kinds") or {}).items()
        ],
        "parse_errors": summary.get("parse_errors"),
        "setup_failure_attempts": (summary.get("setup_failures") or {}).get("attempts"),
        "postconfig_failure_attempts": (summary.get("postconfig_failures") or {}).get("attempts"),
        "ready_timeouts": (summary.get("ready_timeouts") or {}).get("count"),
        "reset_timeouts": (summary.get("reset_timeouts") or {}).get("count"),
        "eval_note_attempts": (summary.get("eval_notes") or {}).get("attempts"),
        "keyboard_restores": (summary.get("keyboard_restores") or {}).get("attempts"),
        "unexpected_window_attempts": (summary.get("unexpected_windows") or {}).get("attempts"),
        "not_typed_actions": summary.get("not_typed_actions"),
        "reset_critical_p50_s": critical.get("overall", {}).get("p50"),
        "reset_critical_p90_s": critical.get("overall", {}).get("p90"),
        "reset_critical_p50_by_domain": [
            (str(d), float(c["p50"]))
            for d, c in (critical.get("by_domain") or {}).items()
            if c.get("p50") is not None
        ],
        "prefix_cache_hit_rate": summary.get("prefix_cache_hit_rate"),
        "logprobs_share": summary.get("logprobs_share"),
        "token_ids_share": summary.get("token_ids_share"),
        **{name: quality.get(name) for name in _QUALITY_COLUMNS},
        "temperature": sampling.get("temperature"),
        "top_p": sampling.get("top_p"),
        "max_tokens": sampling.get("max_tokens"),
        "sampling_seed": sampling.get("seed"),
        "logprobs_mode": sampling.get("logprobs_mode"),
        "knobs": _json(summary.get("knobs") or {}),
        "summary": _json(summary),
    }
    return _table([row], PROFILE_SCHEMA, lineage)


def _table(rows: list[dict[str, Any]], schema: pa.Schema, lineage: Lineage) -> pa.Table:
    lineage_columns = lineage.columns(len(rows))
    columns = {
        field.name: lineage_columns[field.name]
        if field.name in lineage_columns
        else pa.array([row.get(field.name) for row in rows], field.type)
        for field in schema
    }
    return pa.table(columns, schema=schema)
