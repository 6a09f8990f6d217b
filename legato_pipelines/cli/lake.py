"""``legato lake query SQL``, ``legato lake views``, ``legato lake drop VERSION``: the DuckDB
read layer from the shell, and removing a version from the lake; ``legato lake gap VERSION
--model CKPT``: the version's train-inference gap (``legato_pipelines.trainer.gap``);
``legato lake export-trainer VERSION --format F --out DIR``: its samples in a trainer's format
(``legato_pipelines.trainer.formats``).

The lake root is ``--lake``, else ``$LEGATO_LAKE``, else the lake ``legato demo`` writes:
``<instance dir>/lake``, the instance being ``$DAGSTER_HOME``, else the repository root of a
source checkout, else ``./.dagster_home`` (:func:`legato_pipelines.cli.demo.default_lake`),
whatever the current directory. The DuckDB file is opened read-only, so queries run while
partitions materialize; when another process holds it read-write, the error names that
process and ``--parquet`` queries the same views over the Parquet files without the file.
"""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer
from rich.table import Table

from .console import console, fail
from .root import app

lake_app = typer.Typer(
    rich_markup_mode=None,  # help texts hold units in brackets ([s], [tokens]): not markup
    help="Query the Parquet lake through its DuckDB views (read-only); drop a version; "
    "measure a version's train-inference gap; export a version for a trainer.",
    no_args_is_help=True,
)
app.add_typer(lake_app, name="lake")


LakeOption = Annotated[
    str | None,
    typer.Option(
        "--lake",
        help="Lake root (directory or s3:// URL); default $LEGATO_LAKE, else the lake legato demo "
        "writes: <instance>/lake, the instance being $DAGSTER_HOME, else the repository root, "
        "else ./.dagster_home.",
    ),
]


def _lake(root: str | None):
    from ..store.lake import Lake
    from .demo import default_lake

    return Lake(root or os.environ.get("LEGATO_LAKE") or default_lake())


@lake_app.command("query")
def query_command(
    sql: Annotated[
        str,
        typer.Argument(
            help="One SQL statement over rollouts, steps, samples, profile, time_share."
        ),
    ],
    lake: LakeOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per row instead of a table.")
    ] = False,
    limit: Annotated[
        int, typer.Option("--limit", help="Rows shown at most (the table view).")
    ] = 50,
    parquet: Annotated[
        bool,
        typer.Option(
            "--parquet",
            help="Query the Parquet files directly (the same views, in memory) instead of "
            "legato.duckdb: works while another process holds that file or before it exists.",
        ),
    ] = False,
) -> None:
    """Run SQL on the lake's DuckDB views and print the result."""
    import duckdb

    from ..errors import LegatoError

    store = _lake(lake)
    try:
        result = store.query(sql, parquet=parquet)
    except (FileNotFoundError, LegatoError) as exc:
        fail(str(exc))
    except duckdb.Error as exc:
        fail(str(exc))
    rows = result.to_pylist()
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row, default=str))
        return
    table = Table()
    for name in result.column_names:
        table.add_column(name)
    for row in rows[:limit]:
        table.add_row(*["" if v is None else str(v) for v in row.values()])
    console.print(table)
    if len(rows) > limit:
        console.print(f"[dim]{len(rows) - limit} more rows (--limit, or --json for all)[/]")


@lake_app.command("views")
def views_command(lake: LakeOption = None) -> None:
    """Where the lake is, its views and the policy versions each table holds."""
    from ..store.lake import TABLES

    store = _lake(lake)
    console.print(f"lake:   {store.root}\nduckdb: {store.duckdb_path}")
    table = Table("table", "partitions (policy_version)")
    for name in TABLES:
        versions = store.versions(name)
        table.add_row(
            name,
            ", ".join(versions[:10]) + (f" (+{len(versions) - 10})" if len(versions) > 10 else ""),
        )
    console.print(table)


@lake_app.command("drop")
def drop_command(
    version: Annotated[str, typer.Argument(help="The policy version (partition key) to remove.")],
    lake: LakeOption = None,
    run: Annotated[
        bool,
        typer.Option(
            "--run", help="Also remove its run directory (the records the tables were built from)."
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Remove a policy version from the lake (partitions, charts; --run: run directory)."""
    from ..errors import LegatoError
    from ..store.lake import RECORDS_FILE, RUNS_DIR, TABLES

    store = _lake(lake)
    try:
        held = [t for t in TABLES if version in store.versions(t)]
        has_run = version in store.versions(RUNS_DIR, file=RECORDS_FILE)
    except LegatoError as exc:
        fail(str(exc))
    what = (", ".join(held) or "no table") + (" and its run directory" if run and has_run else "")
    if not held and not (run and has_run):
        fail(
            f"lake {store.root}: no partition of policy_version {version!r} (`legato lake views` lists them)"
        )
    if not yes and not typer.confirm(
        f"remove policy_version {version!r} ({what}) from {store.root}?"
    ):
        fail("nothing removed (--yes to skip this question)", 1)
    try:
        removed = store.drop(version, run=run)
    except (LegatoError, OSError) as exc:
        fail(str(exc))
    console.print(
        f"removed policy_version {version!r}: {what} ({len(removed)} folders); views rebuilt. "
        "Dagster's partition is not touched: delete it in the UI if it should go too."
    )


@lake_app.command("gap")
def gap_command(
    version: Annotated[str, typer.Argument(help="The policy version (partition key) to measure.")],
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="Full-weights folder to recompute logprobs with (e.g. the checkpoint the "
            "version was collected from; transformers AutoModelForImageTextToText).",
        ),
    ],
    lake: LakeOption = None,
    python: Annotated[
        str | None,
        typer.Option(
            "--python",
            help="Interpreter with torch and transformers to run the recomputation "
            "(default: this one; e.g. ~/.cache/legato/vllm-venv/bin/python).",
        ),
    ] = None,
    processor: Annotated[
        str | None,
        typer.Option("--processor", help="Processor folder (default: --model's)."),
    ] = None,
    rows: Annotated[int, typer.Option("--rows", min=1, help="Samples to recompute.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sample of rows.")] = 0,
    max_mean: Annotated[
        float | None,
        typer.Option(
            "--max-mean",
            help="Fail (exit 1) when the mean |dlogp| is above this (default 0.05).",
        ),
    ] = None,
    identity: Annotated[
        str,
        typer.Option(
            "--identity",
            help="require: refuse rows naming no or other model files; if-known; skip.",
        ),
    ] = "require",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Measure the train-inference gap of a version: recompute the server's logprobs with
    --model for a sample of rows; mean/max |dlogp|, k3 KL, importance-ratio spread."""
    from ..errors import LegatoError
    from ..trainer.gap import DEFAULT_MAX_MEAN_ABS, version_gap

    threshold = DEFAULT_MAX_MEAN_ABS if max_mean is None else max_mean
    try:
        report = version_gap(
            _lake(lake),
            version,
            model,
            rows=rows,
            seed=seed,
            python=python,
            processor=processor,
            identity=identity,
        )
    except (LegatoError, OSError) as exc:
        fail(str(exc))
    report["max_mean_abs_dlogp"] = threshold
    report["passed"] = (
        report["mean_abs_dlogp"] is not None and report["mean_abs_dlogp"] <= threshold
    )
    if as_json:
        print(json.dumps({k: v for k, v in report.items() if k != "per_row"}))
    else:
        table = Table("figure", "value", title=f"train-inference gap of {version} ({model})")
        for key in (
            "rows", "tokens", "mean_abs_dlogp", "max_abs_dlogp", "k3_kl",
            "ratio_min", "ratio_p05", "ratio_p95", "ratio_max", "ratio_std",
        ):  # fmt: skip
            value = report.get(key)
            table.add_row(key, "n/a" if value is None else f"{value:.6g}")
        console.print(table)
    if not report["passed"]:
        fail(
            f"mean |dlogp| {report['mean_abs_dlogp']} is above {threshold} (or no token was "
            f"compared): {model} does not compute what the server served for {version}",
            1,
        )


@lake_app.command("export-trainer")
def export_trainer_command(
    version: Annotated[str, typer.Argument(help="The policy version (partition key) to export.")],
    trainer: Annotated[
        str,
        typer.Option("--format", help="The trainer's record: verl, prime-rl, skyrl or trl."),
    ],
    out: Annotated[
        str,
        typer.Option("--out", help="Folder to write <format>.parquet and images/ into."),
    ],
    lake: LakeOption = None,
    include_incomplete: Annotated[
        bool,
        typer.Option(
            "--include-incomplete",
            help="Also export rows of groups short of attempts (their advantage is null).",
        ),
    ] = False,
    include_invalid: Annotated[
        bool,
        typer.Option(
            "--include-invalid-logprobs",
            help="Also export rows whose logprobs are not valid (sentinels, length mismatch).",
        ),
    ] = False,
) -> None:
    """Write a version's training samples in a trainer's format (docs/trainer.md §5): one
    record per model call, screenshots copied in order. Rows of incomplete groups and rows
    with invalid logprobs are left out unless asked for."""
    from ..errors import LegatoError
    from ..trainer.formats import export_trainer

    try:
        done = export_trainer(
            _lake(lake),
            version,
            trainer,
            out,
            include_incomplete=include_incomplete,
            include_invalid=include_invalid,
        )
    except (LegatoError, OSError) as exc:
        fail(str(exc))
    excluded = done["excluded"]
    console.print(
        f"wrote {done['rows']} {trainer} records of {version} to {done['path']} "
        f"({done['images']} screenshots in images/); left out: "
        f"{excluded['incomplete_group']} rows of incomplete groups, "
        f"{excluded['invalid_logprobs']} with invalid logprobs"
    )
