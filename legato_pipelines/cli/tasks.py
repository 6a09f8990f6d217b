"""``legato tasks check``: validate a task list and say what every task needs and where it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.markup import escape
from rich.table import Table

from ..desktops.registry import BUILTIN, capabilities, check_options, get, names
from ..desktops.support import backend_support
from ..errors import ConfigError, TaskListError
from ..osworld_format import TaskClass, classify_task, summarize
from ..osworld_format.problems import BACKENDS
from ..tasks import load_tasks
from .console import console as _out
from .console import err as _err
from .console import fail
from .root import app

tasks_app = typer.Typer(
    rich_markup_mode=None,  # help texts hold units in brackets ([s], [tokens]): not markup
    help="Task lists: validate and classify (OSWorld format).",
    no_args_is_help=True,
)
app.add_typer(tasks_app, name="tasks")


OSWORLD_INDEX = "test_all.json"
PROBLEMS_SHOWN = 20  # per backend in the table view when no --backend is given (--json: all)
#: a task's fields (and the totals') about the local backend only: reported when it is checked
LOCAL_TASK_FIELDS = {"evaluator_supported_locally", "unsupported_evaluator_parts", "local_blockers"}
LOCAL_TOTALS = {
    "evaluator_supported_locally",
    "top_unsupported_evaluator_parts",
    "top_local_blockers",
}


def _resolve_tasks_path(tasks: Path | None, osworld: Path | None) -> Path:
    """TASKS as given; else relative to --osworld; else --osworld's test_all.json."""
    if tasks is not None:
        if tasks.exists():
            return tasks
        if osworld is not None and not tasks.is_absolute():
            for root in (osworld, osworld / "evaluation_examples"):
                if (root / tasks).exists():
                    return root / tasks
        # the loader's own message names collect's --tasks; here TASKS is the argument
        raise TaskListError(
            f"tasks check: file '{tasks}' does not exist (fix: give the path of a JSON task "
            "list or OSWorld index as TASKS)"
        )
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


def _meant_for(config: dict) -> tuple[str, ...]:
    """The backends a task is written for: a real desktop (``local``/``osworld``: it has an
    evaluator to grade it), plus ``fake`` when it carries a ``fake`` block. The fake backend
    ignores evaluators, so "runs on fake" alone does not make a task with a broken one usable."""
    return ("local", "osworld", "fake") if "fake" in config else ("local", "osworld")


def _yes(value: bool) -> str:
    return "[green]yes[/]" if value else "[red]no[/]"


def _table(classes: list[TaskClass], checked: tuple[str, ...]) -> Table:
    """One row per task; the backend columns ("run on", "problems") cover ``checked`` only, and
    the local columns ("eval", "local blockers") appear when ``local`` is checked."""
    local = "local" in checked
    table = Table(title="tasks", header_style="bold")
    table.add_column("task", overflow="fold")
    table.add_column("domain", overflow="fold")
    for name in ("run on", "reset", "net") + (("eval",) if local else ()):
        table.add_column(name, no_wrap=True)
    table.add_column("apps", overflow="fold")
    table.add_column("problems", no_wrap=True)
    if local:
        table.add_column("local blockers", overflow="fold", ratio=1)
    for c in classes:
        counts = [
            f"{b[0].upper()}{len(c.problems.get(b, []))}" for b in checked if c.problems.get(b)
        ]
        row = [
            c.task_id if len(c.task_id) <= 24 else c.task_id[:8],
            c.domain or "-",
            " ".join(b[0].upper() if b in c.backends else "-" for b in checked),
            "fast" if c.fast_reset_eligible else "[yellow]revert[/]",
            f"[yellow]yes[/] {len(c.internet_urls)}" if c.needs_internet else "no",
        ]
        if local:
            row.append(_yes(c.evaluator_supported_locally))
        row += [escape(",".join(c.apps) or "-"), f"[red]{' '.join(counts)}[/]" if counts else "-"]
        if local:
            more = " ..." if len(c.local_blockers) > 3 else ""
            row.append(escape("; ".join(c.local_blockers[:3]) + more))
        table.add_row(*row)
    letters = ", ".join(f"{b[0].upper()} {b}" for b in checked)
    table.caption = (
        f"run on: {letters}; net: needs the internet (URLs); "
        + ("eval: evaluator runs locally; " if local else "")
        + "problems: how many make the task unrunnable per backend (listed below)"
    )
    return table


def _totals_table(totals, checked: tuple[str, ...]) -> Table:
    """The totals; ``runnable on`` rows for the ``checked`` backends only (``totals.by_backend``
    holds no other), the local evaluator rows when ``local`` is checked."""
    table = Table(title="totals", header_style="bold", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("tasks", str(totals.tasks))
    for name, n in totals.by_backend.items():
        table.add_row(f"runnable on {name}", str(n))
    table.add_row("fast reset eligible", str(totals.fast_reset_eligible))
    table.add_row("full reset (revert)", str(totals.full_reset))
    table.add_row("need the internet", str(totals.needs_internet))
    if "local" in checked:
        table.add_row("evaluator supported locally", str(totals.evaluator_supported_locally))
        for part, n in totals.top_local_blockers.items():
            table.add_row(f"[dim]local blocker: {part}[/]", str(n))
    return table


def _task_doc(c: TaskClass, checked: tuple[str, ...]) -> dict:
    """A task's ``--json`` entry: its verdict (``backends``, ``problems``) on the ``checked``
    backends only, and the local-only fields when ``local`` is checked."""
    doc = c.model_dump(exclude=None if "local" in checked else LOCAL_TASK_FIELDS)
    doc["backends"] = [b for b in c.backends if b in checked]
    doc["problems"] = {b: p for b, p in c.problems.items() if b in checked}
    return doc


def _support(backend: str | None, cache_dir: Path | None, desktop_option: list[str], desktops: int):
    """What collect's preflight would use (``desktops/support.py``) with the same
    ``--desktop-option`` items and ``desktops`` open at once: one backend's, or (no
    ``--backend``) the local and osworld backends' together. Raises ``ValueError`` for a
    malformed item, ``ConfigError`` for a bad option value."""
    from ..desktops.option_flags import parse_desktop_options

    options = parse_desktop_options(desktop_option)
    if cache_dir is not None:
        options["cache_dir"] = cache_dir
    if backend is not None:
        return backend_support(backend, options, desktops=desktops)
    # every verdict kind at once: the local kind's support with the osworld kind's grader;
    # each backend checks (backend_support) the options it has, and one no backend has is
    # refused by the first one's check
    kinds = {capabilities(name).task_checks: name for name in reversed(names())}
    local, osworld = kinds["local"], kinds["osworld"]
    known = set(get(local).options.model_fields) | set(get(osworld).options.model_fields)
    if set(options) - known:
        check_options(local, options)  # raises, naming the option, the backend and the fix

    def own(name: str) -> dict:
        return {k: v for k, v in options.items() if k in get(name).options.model_fields}

    support = backend_support(local, own(local), desktops=desktops)
    grader = backend_support(osworld, own(osworld)).osworld_grader
    return support.model_copy(update={"osworld_grader": grader})


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
            help="Local file cache: URLs found there do not count as needing the internet "
            "(default: legato osworld cache's directory, $XDG_CACHE_HOME/legato/osworld-files, as "
            "collect's; --desktop-option cache_dir= for none).",
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="Check for this backend only (a registered one: "
            f"{' | '.join(BUILTIN)}; docs/backends.md): list its problems and exit 1 if any "
            "task cannot run on it. Default: list the problems of every backend; exit 1 only "
            "if some task runs on none of the backends it is written for (local or osworld; "
            "fake too when the task has a 'fake' block).",
        ),
    ] = None,
    osworld_provider: Annotated[
        str | None,
        typer.Option(
            "--osworld-provider",
            help="Backend osworld: the DesktopEnv provider collect would use (docker | local | "
            "vmware | aws | ...), as `legato collect --osworld-provider`. The verdict is the "
            "one collect's preflight gives, which no provider changes.",
        ),
    ] = None,
    desktop_option: Annotated[
        list[str] | None,
        typer.Option(
            "--desktop-option",
            help="Backend option KEY=JSON (repeatable), as collect's: grader=own|osworld, "
            "osworld_python=PATH, cache_dir=DIR, network=auto|host|none|own, urls=[...] change the "
            "verdict as they change collect's preflight.",
        ),
    ] = None,
    desktops: Annotated[
        int,
        typer.Option(
            "--desktops",
            min=1,
            help="Local desktops collect opens at once (its --desktops plus --spares): on "
            "network=host they share Chrome's and VLC's ports, so with 2+ the "
            "tasks whose setup or grader reaches those ports cannot run.",
        ),
    ] = 1,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (tasks + problems + totals).")
    ] = False,
    totals_only: Annotated[
        bool, typer.Option("--totals-only", help="Print only the totals table.")
    ] = False,
) -> None:
    """Validate TASKS (every entry, before anything runs) and classify each task: setup step
    types, internet needs, apps, fast-reset eligibility, local evaluator support, backends, and
    the problems that make it unrunnable on a backend (misspelled metric/getter/step names,
    missing evaluator parts or step parameters, internet-only downloads).

    A list with entries that are no task (e.g. one without `instruction`) still reports every
    other entry's problems in the same run, then the bad entries, and exits 2.

    Exit status: 0 when every task can run; 1 when some task cannot run on the backend given with --backend, or (no --backend) on any backend it is written for: a real desktop (local or osworld), or fake for a task with a 'fake' block (the fake backend never grades, so running there alone does not count); 2 when the task list itself is bad (an entry that is no task; the valid entries are classified all the same).
    """
    name = None  # the backend asked for, and the verdict kind that checks its tasks
    if backend is not None:
        name = backend.strip().lower()  # any case, as collect's --backend and LEGATO_BACKEND
        try:  # a plugin that does not load (LEGATO_BACKEND_MODULES, entry points): say which
            known = names()
            if name not in known:
                fail(f"--backend {backend!r}: use one of {', '.join(known)}")
            kind = capabilities(name).task_checks
        except ConfigError as exc:
            fail(str(exc))
    if osworld_provider is not None:
        from ..desktops.osworld_worker.options import PROVIDERS

        if osworld_provider not in PROVIDERS:
            fail(f"--osworld-provider {osworld_provider!r}: use one of {', '.join(PROVIDERS)}")
        if name is not None and "provider" not in get(name).options.model_fields:
            fail(f"--osworld-provider is for a backend with option provider (osworld), not {name}")
    path = None
    list_error: TaskListError | None = None  # entries that are not tasks at all
    try:
        path = _resolve_tasks_path(tasks, osworld)
        task_set = load_tasks(path, osworld=osworld)
        entries = list(enumerate(task_set))
    except TaskListError as exc:
        if not exc.tasks:
            fail(exc.describe())  # every problem of the list, not only the first 20
        # the other entries' own problems are reported in the same run (exit 2 all the same)
        list_error, task_set, entries = exc, None, list(exc.tasks)
    try:
        support = _support(name, cache_dir, desktop_option or [], desktops)
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
    # the engine's preflight judges with classify_task's problems too (osworld_format/verdict.py)
    classes = [classify_task(task, backend_support=support) for _, task in entries]
    checked: tuple[str, ...] = (kind,) if name else BACKENDS
    # only the checked backends were judged with their own support: report no other
    totals = summarize(classes, backends=checked)
    problems = {
        name: [
            f"tasks[{index}] (task_id {c.task_id!r}): {problem}"
            for (index, _), c in zip(entries, classes, strict=True)
            for problem in c.problems.get(name, [])
        ]
        for name in checked
    }
    not_runnable = {
        name: [c.task_id for c in classes if name not in c.backends] for name in checked
    }
    if backend:
        failing = [c for c in classes if kind not in c.backends]
    else:
        failing = [
            c
            for (_, task), c in zip(entries, classes, strict=True)
            if not set(c.backends) & set(_meant_for(task.config))
        ]
    if as_json:
        doc = {
            "path": str(path),
            "task_set": task_set.task_set if task_set is not None else None,
            "backends_checked": list(checked),
            "osworld_provider": osworld_provider,
            "ok": not failing and list_error is None,
            # entries that are no task (each names its index and field); null: none
            "list_problems": list(list_error.problems) if list_error is not None else None,
            "problems": problems,
            "not_runnable": not_runnable,
            "local_desktops": {
                "apps": sorted(support.local_apps),
                "pyautogui": support.local_pyautogui,
                "grader": support.local_grader.kind,
                "grader_source": support.local_grader.source,
                "network": support.local_network,
                "desktops": support.local_desktops,
                "route_out": support.local_route_out,
                "route_out_why_not": support.local_route_why or None,
                "proxy": support.local_proxy,
                "web_archive": str(support.local_web_archive)
                if support.local_web_archive
                else None,
            }
            if "local" in checked
            else None,
            "tasks": [_task_doc(c, checked) for c in classes],
            "totals": totals.model_dump(exclude=None if "local" in checked else LOCAL_TOTALS),
        }
        typer.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    else:
        if not totals_only:
            _out.print(_table(classes, checked))
            limit = None if backend else PROBLEMS_SHOWN
            for name, lines in problems.items():
                if not lines:
                    continue
                _out.print(f"[bold]problems on {name}[/] ({len(lines)}):")
                for line in lines[:limit]:
                    _out.print(f"  {escape(line)}", highlight=False)
                if limit is not None and len(lines) > limit:
                    _out.print(
                        f"  [dim]... {len(lines) - limit} more (--backend {name} or --json lists all)[/]"
                    )
        _out.print(_totals_table(totals, checked))
        if task_set is not None:
            _out.print(
                f"[dim]{escape(str(path))}: {len(task_set)} tasks, task set {task_set.task_set}[/]",
                highlight=False,
            )
        if "local" in checked:
            pyautogui = "with" if support.local_pyautogui else "without"
            _out.print(
                f"[dim]local desktops on this host have: {', '.join(sorted(support.local_apps))};"
                f" {pyautogui} pyautogui (docs/local-desktop.md §11); graded by "
                f"{escape(support.local_grader.source)}[/]",
                highlight=False,
            )
            route = "a route out" if support.local_route_out else "no route out"
            why = "" if support.local_route_out else f" ({support.local_route_why})"
            archive = support.local_web_archive
            _out.print(
                f"[dim]their network has {route}{escape(why)};"
                f" {'a' if support.local_proxy else 'no'} proxy"
                + (f"; websites replayed from {escape(str(archive))}" if archive else "")
                + " (docs/local-desktop.md §15)[/]",
                highlight=False,
            )
        ports = [c for c in classes if c.desktop_ports]
        if "local" in checked and support.local_network == "host" and ports:
            _out.print(
                f"[dim]{len(ports)} task(s) hold Chrome's port 9222 or VLC's 8080, which on "
                "network=host all local desktops share: run 2+ desktops with "
                "--desktop-option network=own (per-desktop ports) or one at a time; those whose "
                "setup or grader reaches the port are refused with 2+ (--desktops N)[/]",
                highlight=False,
            )
        if not backend and any(not_runnable.values()):
            counts = ", ".join(f"{name} {len(ids)}" for name, ids in not_runnable.items() if ids)
            _out.print(
                f"[dim]tasks not runnable per backend: {counts} (--backend NAME fails on them)[/]",
                highlight=False,
            )
    if list_error is not None:  # after the other entries' problems: the list is still bad
        fail(
            f"{list_error.describe()}\n(the other {len(entries)} entries were checked: their "
            "problems are above)"
        )
    if failing:
        if backend:
            what = f"cannot run on the {name} backend"
        else:
            what = "can run on no backend they are written for (local/osworld, fake with a 'fake' block)"
        ids = ", ".join(c.task_id for c in failing[:5]) + (" ..." if len(failing) > 5 else "")
        _err.print(
            f"[bold red]error:[/] {len(failing)} of {len(classes)} task(s) {what}: {escape(ids)} "
            "(the problems above name the field and the fix)",
            highlight=False,
        )
        raise typer.Exit(1)
