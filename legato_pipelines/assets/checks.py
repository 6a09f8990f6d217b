"""Asset checks guarding the storage contract, evaluated by the asset they check, on the
partition it just wrote (``check_specs`` on the asset; results in the same materialization).

``no_attempt_unaccounted`` (rollouts)  every scheduled logical attempt has exactly one final
    record, every ``retried`` execution is followed by one, and
    ``records == scheduled + retries`` (docs/architecture.md §3 accounting)
``logprobs_coverage`` (training_samples)  the shares of samples with *valid* logprobs (present,
    no sentinel, as many as token ids: ``logprobs_valid``) and with token ids are at least a
    floor (run config ``logprobs_floor``, default 0.95 or ``LEGATO_LOGPROBS_FLOOR``): a trainer
    needs the behaviour policy's logprobs; the metadata counts length mismatches and samples
    with sentinel logprobs
``advantages_centered`` (training_samples)  within each group whose rewards vary, the rollouts'
    GRPO advantages sum to ~0 (|sum| <= 1e-6 per rollout); groups without variance have 0
``success_rate_reported`` (profile_summary)  the profile reports a success rate in [0, 1]
``train_inference_gap`` (training_samples, optional: only with a gap model configured,
    ``LEGATO_GAP_MODEL``)  the server's logprobs of a sample of rows, recomputed with that
    model (legato_pipelines/trainer/gap.py), differ by at most ``gap_max_mean_abs`` on average;
    metadata: mean/max |dlogp|, k3 KL, the importance-ratio spread
"""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

import dagster as dg
import pyarrow as pa

from ..record import FINAL_FOR_TRAINING, superseded

ADVANTAGE_TOLERANCE = 1e-6
"""Allowed |sum of advantages| per rollout of a group (float rounding of (r - mean) / std)."""

DEFAULT_LOGPROBS_FLOOR = float(os.environ.get("LEGATO_LOGPROBS_FLOOR", "0.95"))

NO_ATTEMPT_UNACCOUNTED = dg.AssetCheckSpec(
    "no_attempt_unaccounted",
    asset="rollouts",
    description="Every scheduled attempt has exactly one final record; records == scheduled + retries.",
)
LOGPROBS_COVERAGE = dg.AssetCheckSpec(
    "logprobs_coverage",
    asset="training_samples",
    description="Shares of samples with valid logprobs (no sentinel, no length mismatch) and with token ids are at least the floor.",
)
ADVANTAGES_CENTERED = dg.AssetCheckSpec(
    "advantages_centered",
    asset="training_samples",
    description="GRPO advantages sum to ~0 within each group whose rewards vary; 0 where they do not.",
)
SUCCESS_RATE_REPORTED = dg.AssetCheckSpec(
    "success_rate_reported",
    asset="profile_summary",
    description="The profile reports a success rate in [0, 1].",
)


TRAIN_INFERENCE_GAP = dg.AssetCheckSpec(
    "train_inference_gap",
    asset="training_samples",
    description="The server's logprobs of a sample of rows, recomputed with the configured model (LEGATO_GAP_MODEL), differ by at most the threshold on average (mean |dlogp|); k3 KL and importance-ratio spread as metadata.",
)
GAP_FIGURES = (
    "mean_abs_dlogp",
    "max_abs_dlogp",
    "k3_kl",
    "ratio_min",
    "ratio_p05",
    "ratio_p95",
    "ratio_max",
    "ratio_std",
)


def train_inference_gap(report: Mapping[str, Any], max_mean_abs: float) -> dg.AssetCheckResult:
    """The gap check's result from a :func:`~legato_pipelines.trainer.gap.measure_gap`
    report: passed when tokens were compared and their mean |dlogp| is at most
    ``max_mean_abs`` [nats]; the report's figures, rows, tokens and model as metadata."""
    mean = report.get("mean_abs_dlogp")
    metadata: dict[str, Any] = {
        k: dg.MetadataValue.float(float(report[k])) if report.get(k) is not None else "n/a"
        for k in GAP_FIGURES
    }
    metadata |= {
        "rows": int(report.get("rows") or 0),
        "tokens": int(report.get("tokens") or 0),
        "model": str(report.get("model")),
        "max_mean_abs_dlogp": dg.MetadataValue.float(float(max_mean_abs)),
    }
    return dg.AssetCheckResult(
        check_name=TRAIN_INFERENCE_GAP.name,
        passed=mean is not None and mean <= max_mean_abs,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata=metadata,
    )


def no_attempt_unaccounted(rollouts: pa.Table, scheduled: int | None) -> dg.AssetCheckResult:
    """Accounting of the ``rollouts`` partition against the batch's ``scheduled`` attempts."""
    rows = rollouts.select(["task_id", "attempt", "execution", "status"]).to_pylist()
    replaced = superseded(rows)  # retried, or an error a resume re-ran
    finals = Counter(
        (r["task_id"], r["attempt"]) for r, gone in zip(rows, replaced, strict=True) if not gone
    )
    retried = {(r["task_id"], r["attempt"]) for r, gone in zip(rows, replaced, strict=True) if gone}
    duplicated = sorted(k for k, n in finals.items() if n > 1)
    orphaned = sorted(retried - set(finals))
    scheduled = len(finals) if scheduled is None else scheduled
    retries = sum(replaced)
    missing = max(0, scheduled - len(finals))
    passed = not duplicated and not orphaned and missing == 0 and len(rows) == scheduled + retries
    return dg.AssetCheckResult(
        check_name=NO_ATTEMPT_UNACCOUNTED.name,
        passed=passed,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "scheduled": scheduled,
            "records": len(rows),
            "retries": retries,
            "missing": missing,
            "duplicated_attempts": dg.MetadataValue.json([list(k) for k in duplicated[:10]]),
            "retried_without_final": dg.MetadataValue.json([list(k) for k in orphaned[:10]]),
        },
    )


def logprobs_coverage(samples: pa.Table, floor: float) -> dg.AssetCheckResult:
    """Shares of ``samples`` rows with valid logprobs (``logprobs_valid``; a table without that
    column: non-empty ``response_logprobs``) and non-empty ``response_token_ids``, against
    ``floor``; metadata also counts ``length_mismatches`` and ``logprob_sentinel_samples``."""
    n = samples.num_rows
    names = samples.column_names
    if "logprobs_valid" in names:
        logprobs = sum(1 for v in samples.column("logprobs_valid").to_pylist() if v)
    else:
        logprobs = sum(1 for v in samples.column("response_logprobs").to_pylist() if v)
    mismatches = (
        sum(1 for v in samples.column("length_mismatch").to_pylist() if v)
        if "length_mismatch" in names
        else 0
    )
    sentinels = (
        sum(1 for v in samples.column("logprob_sentinels").to_pylist() if v)
        if "logprob_sentinels" in names
        else 0
    )
    token_ids = sum(1 for v in samples.column("response_token_ids").to_pylist() if v)
    logprobs_share = logprobs / n if n else 0.0
    token_ids_share = token_ids / n if n else 0.0
    return dg.AssetCheckResult(
        check_name=LOGPROBS_COVERAGE.name,
        passed=bool(n) and logprobs_share >= floor and token_ids_share >= floor,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "samples": n,
            "logprobs_share": logprobs_share,
            "token_ids_share": token_ids_share,
            "length_mismatches": mismatches,
            "logprob_sentinel_samples": sentinels,
            "floor": floor,
        },
    )


def advantages_centered(samples: pa.Table) -> dg.AssetCheckResult:
    """GRPO: per group, advantages (one per rollout) sum to ~0 if rewards vary, else are 0."""
    rows = samples.select(["group_id", "rollout_id", "reward", "advantage"]).to_pylist()
    per_rollout = {r["rollout_id"]: r for r in rows}  # a rollout's steps share reward/advantage
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in per_rollout.values():
        groups[r["group_id"]].append(r)
    bad: dict[str, float] = {}
    varied = 0
    for group_id, members in groups.items():
        total = math.fsum(m["advantage"] or 0.0 for m in members)
        if len({m["reward"] for m in members}) > 1:
            varied += 1
            if abs(total) > ADVANTAGE_TOLERANCE * len(members):
                bad[group_id] = total
        elif any(m["advantage"] for m in members):
            bad[group_id] = total
    return dg.AssetCheckResult(
        check_name=ADVANTAGES_CENTERED.name,
        passed=not bad,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "groups": len(groups),
            "groups_with_variance": varied,
            "bad_groups": dg.MetadataValue.json(dict(list(bad.items())[:10])),
        },
    )


def success_rate_reported(summary: Mapping[str, Any]) -> dg.AssetCheckResult:
    """The summary's ``success_rate`` is a number in [0, 1] (a WARN when it is missing)."""
    rate = summary.get("success_rate")
    counts = summary.get("counts") or {}
    return dg.AssetCheckResult(
        check_name=SUCCESS_RATE_REPORTED.name,
        passed=rate is not None and 0.0 <= float(rate) <= 1.0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "success_rate": dg.MetadataValue.float(float(rate))
            if rate is not None
            else dg.MetadataValue.text("n/a"),
            "final_attempts": sum(int(counts.get(s, 0)) for s in FINAL_FOR_TRAINING),
        },
    )
