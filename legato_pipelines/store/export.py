"""Training samples: one row per step of every ``ok``/``truncated`` rollout, with its group
advantage (GRPO), ready for a trainer (``legato export``, the ``samples`` lake table).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import ConfigError
from ..record import Record, is_final
from .rundir import load_messages, read_meta, read_typed_records

SAMPLE_SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("group_id", pa.string()),
        ("task_id", pa.string()),
        ("attempt", pa.int32()),
        ("step", pa.int32()),
        ("messages", pa.string()),  # JSON list of the exact messages sent (image refs or data URLs)
        ("response_text", pa.string()),
        ("response_reasoning", pa.string()),
        ("response_token_ids", pa.list_(pa.int64())),
        ("response_logprobs", pa.list_(pa.float64())),
        ("response_tokens", pa.list_(pa.string())),
        ("finish_reason", pa.string()),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("status", pa.string()),
        ("policy_version", pa.string()),
        ("task_set", pa.string()),
    ]
)


def group_advantages(records: Iterable[Record | Mapping[str, Any]]) -> dict[str, float]:
    """GRPO advantages: ``rollout_id -> (reward - group mean) / group std``.

    The group is a task's ``ok`` + ``truncated`` attempts. The std is the *population* std
    (ddof=0), as GRPO (DeepSeekMath; TRL's and verl's implementations) normalizes by the std of
    the rewards actually sampled, not an unbiased estimate of a wider population; it is also
    defined for a group of one. When every reward in a group is equal (std 0) the advantages
    are 0: the group carries no learning signal.

    ``records``: typed records, or their JSON dicts (only ``rollout_id``, ``group_id``,
    ``reward`` and ``status`` are read).
    """
    groups: dict[str, list[tuple[str, float | None]]] = defaultdict(list)
    for r in records:
        if isinstance(r, Record):
            status, group_id, member = r.status, r.group_id, (r.rollout_id, r.reward)
        else:
            status, group_id, member = r["status"], r["group_id"], (r["rollout_id"], r["reward"])
        if is_final(status):
            groups[group_id].append(member)
    out: dict[str, float] = {}
    for members in groups.values():
        rewards = np.array(
            [0.0 if reward is None else reward for _, reward in members], dtype=float
        )
        mean, std = rewards.mean(), rewards.std()
        for (rollout_id, _), reward in zip(members, rewards, strict=True):
            out[rollout_id] = 0.0 if std < 1e-12 else float((reward - mean) / std)
    return out


def export_steps(run_dir: str | Path, *, inline_images: bool = False) -> pa.Table:
    """One row per step of every ``ok``/``truncated`` rollout (schema :data:`SAMPLE_SCHEMA`).

    ``messages`` is the JSON of the exact prompt sent at that step; images are
    ``legato-image://<sha>`` refs into ``<run_dir>/images/`` unless ``inline_images`` (then the
    data URLs that went over the wire: large).
    """
    read_meta(run_dir)  # raises ConfigError when run_dir is not a run directory
    records = read_typed_records(run_dir)
    advantages = group_advantages(records)
    rows: dict[str, list] = {name: [] for name in SAMPLE_SCHEMA.names}
    message_cache: dict[str, str] = {}
    for record in records:
        if not record.final:
            continue
        for step in record.steps:
            response = step.response
            rows["rollout_id"].append(record.rollout_id)
            rows["group_id"].append(record.group_id)
            rows["task_id"].append(record.task_id)
            rows["attempt"].append(record.attempt)
            rows["step"].append(step.step)
            rows["messages"].append(
                _messages_json(run_dir, step.request, inline_images, message_cache)
            )
            rows["response_text"].append(response.content)
            rows["response_reasoning"].append(response.reasoning)
            rows["response_token_ids"].append(response.token_ids)
            rows["response_logprobs"].append(response.logprobs)
            rows["response_tokens"].append(response.tokens)
            rows["finish_reason"].append(response.finish_reason)
            rows["reward"].append(record.reward)
            rows["advantage"].append(advantages[record.rollout_id])
            rows["status"].append(record.status)
            rows["policy_version"].append(record.policy.version)
            rows["task_set"].append(record.task_set)
    return pa.Table.from_pydict(rows, schema=SAMPLE_SCHEMA)


def _messages_json(run_dir, shas: list[str], inline: bool, cache: dict[str, str]) -> str:
    parts = []
    for sha in shas:
        if sha not in cache:
            cache[sha] = orjson.dumps(
                load_messages(run_dir, [sha], inline_images=inline)[0]
            ).decode()
        parts.append(cache[sha])
    return "[" + ",".join(parts) + "]"


def write_table(table: pa.Table, out: str | Path, *, run_dir: str | Path | None = None) -> Path:
    """Write ``table`` as ``.parquet`` or ``.jsonl`` by the extension of ``out``.

    Raises ``ConfigError`` for another extension, or for a path inside ``run_dir`` (an export
    must never overwrite the run it was made from).
    """
    path = Path(out)
    if run_dir is not None and path.resolve().is_relative_to(Path(run_dir).resolve()):
        raise ConfigError(
            f"--out {path}: inside the run directory {run_dir}; write the export elsewhere (fix: another --out)"
        )
    suffix = path.suffix.lower()
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".parquet":
        pq.write_table(table, path)
    elif suffix == ".jsonl":
        with open(path, "wb") as fh:
            for row in table.to_pylist():
                fh.write(orjson.dumps(row) + b"\n")
    else:
        raise ConfigError(f"--out: {path.name} must end in .parquet or .jsonl")
    return path
