"""Training samples: one row per step of every ``ok``/``truncated`` rollout with a valid
reward, with its group advantage (GRPO), ready for a trainer (``legato export``, the
``samples`` lake table).

Every row says what a trainer must know before trusting its numbers (:func:`step_quality`):
``parse_error``, ``finish_reason``, ``length_mismatch`` (token ids, logprobs and
``completion_tokens`` disagree), ``logprob_sentinels`` (logprobs the server clamped or sent
non-finite: stored as null, never as a number), ``logprobs_valid`` (all of it fine: one
``WHERE logprobs_valid`` keeps what an importance ratio can use) and ``reward_valid``; the
exact prompt ids the server saw (``prompt_token_ids``, when it returned them), the
sampling settings of the run and its weights (``served_model``, ``checkpoint_path``,
``checkpoint_fingerprint``, ``load_mode``, ``load_proof``: lineage) and its GRPO group
(``group_size``, ``group_size_expected``, ``group_complete``: an incomplete group's rows carry
no advantage, :func:`export_steps`); what a trainer needs to rebuild the exact model input
(``image_shas``: the screenshots in placeholder order) and to check it has the files that made
the ids (``model_files_root``, ``tokenizer_sha256``, ``chat_template_sha256``,
``processor_sha256``: ``run.json``'s ``model_files``; docs/trainer.md).
"""

from __future__ import annotations

import functools
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import ConfigError
from ..images import IMAGE_REF_PREFIX
from ..model_files import IDENTITY_KEYS
from ..record import Record, Step, decode_prompt_ids, is_final, valid_reward
from .rundir import load_messages, read_meta, read_typed_records

if TYPE_CHECKING:
    import pyarrow as pa


@functools.cache
def sample_schema() -> pa.Schema:
    """:data:`SAMPLE_SCHEMA`, built on first use: pyarrow (and numpy under it) is imported
    only by what writes or reads tables, never by ``legato collect`` (~0.15 s of start-up)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("rollout_id", pa.string()),
            ("group_id", pa.string()),
            ("task_id", pa.string()),
            ("attempt", pa.int32()),
            ("step", pa.int32()),
            (
                "messages",
                pa.string(),
            ),  # JSON list of the exact messages sent (image refs or data URLs)
            ("response_text", pa.string()),
            ("response_reasoning", pa.string()),
            ("response_token_ids", pa.list_(pa.int64())),
            ("response_logprobs", pa.list_(pa.float64())),
            ("response_tokens", pa.list_(pa.string())),
            ("finish_reason", pa.string()),
            ("reward", pa.float64()),
            ("advantage", pa.float64()),  # null for an incomplete group (group_complete)
            ("status", pa.string()),
            ("policy_version", pa.string()),
            ("task_set", pa.string()),
            # the exact prompt the server tokenized (None: the server did not return it)
            ("prompt_token_ids", pa.list_(pa.int64())),
            # quality: one WHERE filters what a trainer must not use (see step_quality)
            ("parse_error", pa.string()),
            ("length_mismatch", pa.bool_()),
            ("logprob_sentinels", pa.int32()),
            ("logprobs_valid", pa.bool_()),
            ("reward_valid", pa.bool_()),
            # sampling settings of the run (run.json's sampling; None: not recorded);
            # sampling_seed: the seed the step's request carried (Step.seed), else the run's
            ("temperature", pa.float64()),
            ("top_p", pa.float64()),
            ("max_tokens", pa.int64()),
            ("sampling_seed", pa.int64()),
            ("logprobs_mode", pa.string()),
            # the weights (run.json's checkpoint entry; store/lake_tables.py: load_proof 'none'
            # means checkpoint_path / checkpoint_fingerprint were not shown to be served)
            ("served_model", pa.string()),
            ("checkpoint_path", pa.string()),
            ("checkpoint_fingerprint", pa.string()),
            ("load_mode", pa.string()),
            ("load_proof", pa.string()),
            # the GRPO group: graded attempts (valid reward) the advantage is normalized over,
            # the attempts it was collected for (run.json knobs.group; None: not recorded), and
            # whether it has them all (None: size not recorded); incomplete: advantage null
            ("group_size", pa.int32()),
            ("group_size_expected", pa.int32()),
            ("group_complete", pa.bool_()),
            # the screenshots of the prompt, in the order its placeholders appear (SHA-256 of
            # the PNG: <run_dir>/images/<sha>.png); what made the ids (run.json model_files,
            # legato_pipelines/model_files.py): the served folder and its files' hashes (None: unknown)
            ("image_shas", pa.list_(pa.string())),
            ("model_files_root", pa.string()),
            ("tokenizer_sha256", pa.string()),
            ("chat_template_sha256", pa.string()),
            ("processor_sha256", pa.string()),
        ]
    )


IMAGE_REF_RE = re.compile(re.escape(IMAGE_REF_PREFIX) + r"([0-9a-f]{64})")
"""A screenshot ref in a stored message (``legato-image://<sha>``)."""

WEIGHTS_COLUMNS = (
    "served_model",
    "checkpoint_path",
    "checkpoint_fingerprint",
    "load_mode",
    "load_proof",
)

SAMPLING_COLUMNS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_tokens": "max_tokens",
    "sampling_seed": "seed",
    "logprobs_mode": "logprobs_mode",
}
"""Sample column -> key of ``run.json``'s ``sampling``."""


def clean_logprob(value: Any) -> float | None:
    """A stored logprob as a trainer may read it: the float, or ``None`` for a sentinel
    (``None``, ``<= -9999`` (vLLM's clamp of -inf), NaN, +-inf: records written before the
    client cleaned them may hold ``-9999.0``)."""
    if isinstance(value, int | float) and math.isfinite(value) and value > -9999.0:
        return float(value)
    return None


def step_quality(step: Step) -> dict[str, Any]:
    """What a trainer must know about one step's numbers (units: counts of tokens).

    ``length_mismatch``: the step has token ids and logprobs of different lengths, or the
    client noted ids / logprobs / ``completion_tokens`` disagreeing (``length_mismatch: ...``);
    ``logprob_sentinels``: logprobs that are no logprob (see :func:`clean_logprob`);
    ``logprobs_valid``: logprobs present, none a sentinel, no length mismatch (what an
    importance ratio can use); ``logprobs``: the logprobs with sentinels as ``None``;
    ``parse_error`` and ``finish_reason`` as recorded.
    """
    response = step.response
    notes = step.model.notes or []
    raw = response.logprobs
    logprobs = None if raw is None else [clean_logprob(v) for v in raw]
    sentinels = 0 if logprobs is None else sum(1 for v in logprobs if v is None)
    ids = response.token_ids
    mismatch = any(str(n).startswith("length_mismatch") for n in notes) or (
        ids is not None and raw is not None and len(ids) != len(raw)
    )
    return {
        "logprobs": logprobs,
        "parse_error": step.parse_error,
        "finish_reason": response.finish_reason,
        "length_mismatch": mismatch,
        "logprob_sentinels": sentinels,
        "logprobs_valid": bool(logprobs) and not sentinels and not mismatch,
    }


def prompt_token_ids(record: Record) -> list[list[int] | None]:
    """Per step of ``record``, the prompt token ids the server returned (decoded from
    ``Step.prompt_ids``), or ``None`` for a step without them."""
    out: list[list[int] | None] = []
    previous: list[int] | None = None
    for step in record.steps:
        if step.prompt_ids is None:
            out.append(None)
            continue
        previous = decode_prompt_ids(previous, step.prompt_ids)
        out.append(previous)
    return out


def group_members(
    records: Iterable[Record | Mapping[str, Any]],
) -> dict[str, list[tuple[str, Any]]]:
    """``group_id -> [(rollout_id, reward), ...]`` over the ``ok``/``truncated`` attempts
    (the GRPO group before rewards are checked). ``records``: typed or JSON dicts (only
    ``rollout_id``, ``group_id``, ``reward`` and ``status`` are read)."""
    groups: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for r in records:
        if isinstance(r, Record):
            status, group_id, member = r.status, r.group_id, (r.rollout_id, r.reward)
        else:
            status, group_id = r.get("status"), r.get("group_id")
            member = (r.get("rollout_id"), r.get("reward"))
        if is_final(status):
            groups[group_id].append(member)
    return dict(groups)


def graded_size(members: Iterable[tuple[str, Any]]) -> int:
    """How many of a group's members (:func:`group_members`) have a valid reward: the
    attempts its advantages are normalized over."""
    return sum(1 for _, reward in members if valid_reward(reward))


def group_advantages(
    records: Iterable[Record | Mapping[str, Any]], *, group_size: int | None = None
) -> dict[str, float | None]:
    """GRPO advantages: ``rollout_id -> (reward - group mean) / group std``.

    The group is a task's ``ok`` + ``truncated`` attempts **with a valid reward** (a finite
    number, :func:`~legato_pipelines.record.valid_reward`). The std is the *population* std
    (ddof=0), as GRPO (DeepSeekMath; TRL's and verl's implementations) normalizes by the std of
    the rewards actually sampled, not an unbiased estimate of a wider population; it is also
    defined for a group of one. When every valid reward in a group is equal (std 0) the
    advantages are 0: the group carries no learning signal.

    ``group_size``: the attempts a group was collected for (``run.json``'s ``knobs.group``). A
    group with fewer valid rewards than that is incomplete (a batch stopped early, attempts
    ended in error, rewards invalid): its mean and std would be those of part of the group, so
    all its members get ``None``. ``None`` (the size is not known): every group counts.

    Total over any input: an attempt whose reward is ``None``, NaN, +-inf or not a number is
    left out of its group's mean and std and gets ``None`` (never NaN, never an invented 0);
    a group with no valid reward gives ``None`` to all. Every returned number is finite.

    ``records``: typed records, or their JSON dicts (only ``rollout_id``, ``group_id``,
    ``reward`` and ``status`` are read).
    """
    out: dict[str, float | None] = {}
    for members in group_members(records).values():
        rewards = [float(reward) for _, reward in members if valid_reward(reward)]
        if group_size is not None and len(rewards) < group_size:
            out.update(dict.fromkeys((rollout_id for rollout_id, _ in members), None))
            continue
        mean = std = 0.0
        if rewards:
            mean = math.fsum(rewards) / len(rewards)
            std = math.sqrt(math.fsum((x - mean) ** 2 for x in rewards) / len(rewards))
        for rollout_id, reward in members:
            if not valid_reward(reward):
                out[rollout_id] = None
            elif std < 1e-12 or not math.isfinite(std):
                out[rollout_id] = 0.0
            else:
                out[rollout_id] = (float(reward) - mean) / std
    return out


def run_group_size(meta: Mapping[str, Any]) -> int | None:
    """The attempts per group a run was collected for (``run.json``'s ``knobs.group``), or
    ``None`` for a run that does not record it."""
    size = (meta.get("knobs") or {}).get("group")
    return int(size) if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def __getattr__(name: str) -> Any:
    if name == "SAMPLE_SCHEMA":  # the pyarrow schema of a sample row (sample_schema())
        return sample_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def export_steps(run_dir: str | Path, *, inline_images: bool = False) -> pa.Table:
    """One row per step of every ``ok``/``truncated`` rollout with a valid reward (schema
    :data:`SAMPLE_SCHEMA`). A final rollout without a valid reward (a run written before
    such rewards became evaluator errors) is no training sample and is left out.

    A group with fewer graded attempts than the run collected it for (``run.json``'s
    ``knobs.group``: an interrupted batch, attempts in error) is kept but marked
    ``group_complete = false``, with ``advantage`` null: an advantage normalized over part of
    a group is not GRPO's (:func:`group_advantages`). :func:`incomplete_groups` counts them.

    ``messages`` is the JSON of the exact prompt sent at that step; images are
    ``legato-image://<sha>`` refs into ``<run_dir>/images/`` unless ``inline_images`` (then the
    data URLs that went over the wire: large). ``prompt_token_ids`` are the ids the server
    returned for that prompt (vLLM ``return_token_ids``, SGLang), ``None`` when it did not;
    sentinel logprobs are ``None`` inside ``response_logprobs`` (see :func:`step_quality`).
    Raises ``ConfigError`` when ``run_dir`` is not a run directory.
    """
    meta = read_meta(run_dir)  # raises ConfigError when run_dir is not a run directory
    sampling = meta.get("sampling") or {}
    weights = run_weights(meta)
    records = read_typed_records(run_dir)
    expected = run_group_size(meta)
    advantages = group_advantages(records, group_size=expected)
    sizes = {gid: graded_size(members) for gid, members in group_members(records).items()}
    import pyarrow as pa

    schema = sample_schema()
    rows: dict[str, list] = {name: [] for name in schema.names}
    message_cache: dict[str, str] = {}
    shas_cache: dict[str, list[str]] = {}
    files = meta.get("model_files") or {}
    for record in records:
        if not record.final or not record.reward_valid:
            continue
        prompts = prompt_token_ids(record)
        for step, prompt_ids in zip(record.steps, prompts, strict=True):
            response = step.response
            quality = step_quality(step)
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
            rows["response_logprobs"].append(quality["logprobs"])
            rows["response_tokens"].append(response.tokens)
            rows["finish_reason"].append(response.finish_reason)
            rows["reward"].append(record.reward)
            rows["advantage"].append(advantages[record.rollout_id])
            rows["status"].append(record.status)
            rows["policy_version"].append(record.policy.version)
            rows["task_set"].append(record.task_set)
            rows["prompt_token_ids"].append(prompt_ids)
            for name in ("parse_error", "length_mismatch", "logprob_sentinels", "logprobs_valid"):
                rows[name].append(quality[name])
            rows["reward_valid"].append(True)
            for column, key in SAMPLING_COLUMNS.items():
                rows[column].append(sampling.get(key))
            if step.seed is not None:  # the seed this step's request carried (issue 31)
                rows["sampling_seed"][-1] = step.seed
            for column in WEIGHTS_COLUMNS:
                rows[column].append(weights[column])
            size = sizes[record.group_id]
            rows["group_size"].append(size)
            rows["group_size_expected"].append(expected)
            rows["group_complete"].append(None if expected is None else size >= expected)
            rows["image_shas"].append(image_shas(run_dir, step.request, shas_cache))
            rows["model_files_root"].append(files.get("root"))
            for key in IDENTITY_KEYS:
                rows[key].append(files.get(key))
    return pa.Table.from_pydict(rows, schema=schema)


def incomplete_groups(samples: pa.Table) -> int:
    """How many groups of an export (:func:`export_steps`, a ``samples`` partition) are
    incomplete (``group_complete`` false); 0 for a table without the column (older files)."""
    if "group_complete" not in samples.column_names:
        return 0
    rows = samples.select(["group_id", "group_complete"]).to_pylist()
    return len({r["group_id"] for r in rows if r["group_complete"] is False})


def run_weights(meta: Mapping[str, Any]) -> dict[str, str | None]:
    """The weights columns of a run (``run.json``'s ``checkpoint`` entry; the lake's lineage
    reads the same, :class:`~.lake_tables.Lineage`). ``load_proof`` is ``changed`` when the
    check after collecting found other weights served (``after.changed``): its rows are not
    proven to come from the checkpoint."""
    served = meta.get("checkpoint") or {}
    load = served.get("load")
    if (served.get("after") or {}).get("changed"):  # swapped mid-run: nothing proven
        proof = "changed"
    else:
        proof = (served.get("proof") or {}).get("kind") or ("none" if load == "none" else None)
    return {
        "served_model": served.get("served_model") or (meta.get("policy") or {}).get("model"),
        "checkpoint_path": served.get("path"),
        "checkpoint_fingerprint": served.get("fingerprint"),
        "load_mode": load,
        "load_proof": proof,
    }


def image_shas(run_dir, message_shas: list[str], cache: dict[str, list[str]]) -> list[str]:
    """The screenshots (PNG SHA-256s) of a prompt, message by message and part by part: the
    order the chat template writes their placeholders and the server reads them."""
    out: list[str] = []
    for sha in message_shas:
        if sha not in cache:
            message = load_messages(run_dir, [sha], inline_images=False)[0]
            cache[sha] = IMAGE_REF_RE.findall(orjson.dumps(message).decode())
        out.extend(cache[sha])
    return out


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
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif suffix == ".jsonl":
        with open(path, "wb") as fh:
            for row in table.to_pylist():
                fh.write(orjson.dumps(row) + b"\n")
    else:
        raise ConfigError(f"--out: {path.name} must end in .parquet or .jsonl")
    return path
