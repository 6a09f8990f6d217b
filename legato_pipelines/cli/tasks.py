"""``legato tasks check``: validate a task list and say what every task needs and where it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.table import Table

from ..errors import TaskListError
from ..osworld_format import BackendSupport, TaskClass, classify_task, summarize
from ..tasks import load_tasks
from . import app
from .console import console as _out
from .console import fail

tasks_app = typer.Typer(
    help="Task lists: validate and classify (OSWorld format).", no_args_is_help=True
)
app.add_typer(tasks_app, name="tasks")


OSWORLD_INDEX = "test_all.json"


def _resolve_tasks_path(tasks: Path | None, osworld: Path | None) -> Path:
    """TASKS as given; else relative to --osworld; else --osworld's test_all.json."""
    if tasks is not None:
        if tasks.exists() or osworld is None or tasks.is_absolute():
            return tasks
        for root in (osworld, osworld / "evaluation_examples"):
            if (root / tasks).exists():
                return root / tasks
        return tasks
    if osworld is None:
        raise TaskListError(
            "tasks check: pass TASKS (a task list or OSWorld index) or --osworld DIR"
        )
    for root in (osworld, osworld / "evaluation_examples"):
        if (root / OSWORLD_INDEX).is_file():
            return root / OSWORLD_INDEX
    raise TaskListError(
        f"tasks check: no {OSWORLD_INDEX} in {osworld} or {osworld}/evaluation_examples (pass TASKS)"
    )


def _yes(value: bool) -> str:
    return "[green]yes[/]" if value else "[red]no[/]"


def _table(classes: list[TaskClass]) -> Table:
    table = Table(title="tasks", header_style="bold")
    table.add_column("task", overflow="fold")
    table.add_column("domain", overflow="fold")
    for name in ("run on", "reset", "net", "eval"):
        table.add_column(name, no_wrap=True)
    table.add_column("apps", overflow="fold")
    table.add_column("local blockers", overflow="fold", ratio=1)
    for c in classes:
        table.add_row(
            c.task_id if len(c.task_id) <= 24 else c.task_id[:8],
            c.domain or "-",
            " ".join(
                b[0].upper() if b in c.backends else "-" for b in ("local", "osworld", "fake")
            ),
            "fast" if c.fast_reset_eligible else "[yellow]revert[/]",
            f"[yellow]yes[/] {len(c.internet_urls)}" if c.needs_internet else "no",
            _yes(c.evaluator_supported_locally),
            ",".join(c.apps) or "-",
            "; ".join(c.local_blockers[:3]) + (" ..." if len(c.local_blockers) > 3 else ""),
        )
    table.caption = "run on: L local, O osworld, F fake; net: needs the internet (URLs); eval: evaluator runs locally"
    return table


def _totals_table(totals) -> Table:
    table = Table(title="totals", header_style="bold", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("tasks", str(totals.tasks))
    for name, n in totals.by_backend.items():
        table.add_row(f"runnable on {name}", str(n))
    table.add_row("fast reset eligible", str(totals.fast_reset_eligible))
    table.add_row("full reset (revert)", str(totals.full_reset))
    table.add_row("need the internet", str(totals.needs_internet))
    table.add_row("evaluator supported locally", str(totals.evaluator_supported_locally))
    for part, n in totals.top_local_blockers.items():
        table.add_row(f"[dim]local blocker: {part}[/]", str(n))
    return table


@tasks_app.command("check")
def check_command(
    tasks: Annotated[
        Path | None,
        typer.Argument(
            help="Task list JSON, or an OSWorld index (test_all.json); default: --osworld's test_all.json."
        ),
    ] = None,
    osworld: Annotated[
        Path | None,
        typer.Option(
            "--osworld", help="OSWorld checkout, or a directory laid out <domain>/<id>.json."
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--cache-dir",
            help="Local file cache: URLs found there do not count as needing the internet.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (tasks + totals).")
    ] = False,
    totals_only: Annotated[
        bool, typer.Option("--totals-only", help="Print only the totals table.")
    ] = False,
) -> None:
    """Validate TASKS (every entry, before anything runs) and classify each task: setup step
    types, internet needs, apps, fast-reset eligibility, local evaluator support, backends."""
    try:
        path = _resolve_tasks_path(tasks, osworld)
        task_set = load_tasks(path, osworld=osworld)
    except TaskListError as exc:
        fail(str(exc))
    support = BackendSupport(cache_dir=cache_dir)
    classes = [classify_task(task, backend_support=support) for task in task_set]
    totals = summarize(classes)
    if as_json:
        doc = {
            "path": str(path),
            "task_set": task_set.task_set,
            "tasks": [c.model_dump() for c in classes],
            "totals": totals.model_dump(),
        }
        typer.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        return
    if not totals_only:
        _out.print(_table(classes))
    _out.print(_totals_table(totals))
    _out.print(
        f"[dim]{path}: {len(task_set)} tasks, task set {task_set.task_set}[/]", highlight=False
    )
