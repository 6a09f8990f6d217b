"""``legato osworld``: ``install`` (the interpreter the ``osworld`` backend's workers run under) and
``cache`` (fetch the files task configs reference into the file cache, so runs are offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..errors import TaskListError
from ..osworld_format.fetch import DEFAULT_JOBS, ENDPOINT_ENV
from ..osworld_format.sources import default_cache_dir
from ..tasks import TaskSet, load_tasks
from .console import console, err, fail
from .root import app

osworld_app = typer.Typer(
    rich_markup_mode=None,  # help texts hold units in brackets ([s], [tokens]): not markup
    help="OSWorld: DesktopEnv in its own venv (the osworld backend); the file cache of its tasks.",
    no_args_is_help=True,
)
app.add_typer(osworld_app, name="osworld")


@osworld_app.command("install")
def install_command(
    venv: Annotated[
        Path | None,
        typer.Option(
            "--venv",
            help="Where to create the venv (default $LEGATO_OSWORLD_VENV or ~/.cache/legato/osworld-venv).",
        ),
    ] = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Also the no-torch evaluator packages (documents, images, audio, PDF): ~1.4 GB.",
        ),
    ] = False,
) -> None:
    """Create a venv with desktop-env 1.0.2 (--no-deps) and the core (or --full) recipe.

    Prints the interpreter to pass as ``legato collect --backend osworld --osworld-python``.
    """
    from ..desktops.osworld_worker.install import install

    with console.status("installing desktop-env into its own venv ..."):
        try:
            result = install(venv, full=full)
        except RuntimeError as exc:
            console.print(f"[bold red]error:[/] {exc}")
            raise typer.Exit(1) from None
    console.print(
        f"osworld venv ready ({result['recipe']}, {result['size_mb']} MB, {result['seconds']} s): "
        f"--osworld-python {result['python']}",
        highlight=False,
    )


def _load_task_list(tasks: Path, osworld: Path | None) -> TaskSet:
    """TASKS as ``legato tasks check`` reads it, plus: a directory is an OSWorld checkout (or a
    ``<domain>/<id>.json`` tree) with its ``test_all.json``, and an index file resolves its
    tasks beside it (``examples/`` next to it, else its own directory) when --osworld is not given."""
    from .tasks import _resolve_tasks_path

    if tasks.is_dir() and osworld is None:
        tasks, osworld = None, tasks
    path = Path(_resolve_tasks_path(tasks, osworld))
    if osworld is None:
        osworld = path.parent / "examples" if (path.parent / "examples").is_dir() else path.parent
    return load_tasks(path, osworld=osworld)


@osworld_app.command("cache")
def cache_command(
    tasks: Annotated[
        Path,
        typer.Argument(
            help="Task list JSON, an OSWorld index (test_all.json) or a directory holding one.",
        ),
    ],
    osworld: Annotated[
        Path | None,
        typer.Option(
            "--osworld",
            help="OSWorld checkout, or a directory laid out <domain>/<id>.json (default: beside the index).",
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--cache-dir",
            help=f"The file cache to fill (default {default_cache_dir()}, i.e. "
            "$XDG_CACHE_HOME/legato/osworld-files, which the local backend, legato collect and "
            "legato tasks check read when given no cache; another DIR: pass it to them as "
            "--desktop-option cache_dir=DIR / --cache-dir DIR).",
            show_default=False,
        ),
    ] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", min=1, max=64, help="Files fetched at once.")
    ] = DEFAULT_JOBS,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Also HEAD every file already present and fetch it again when its size differs "
            "from the Content-Length (default: a present file is skipped without a request).",
        ),
    ] = False,
    attempts: Annotated[
        int,
        typer.Option(
            "--attempts",
            min=1,
            max=20,
            help="Tries per file (a dropped connection resumes with a Range request; a 4xx answer is final).",
        ),
    ] = 3,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1, help="Seconds a connect or a read may take.")
    ] = 60.0,
    no_progress: Annotated[
        bool, typer.Option("--no-progress", help="No progress bar (the summary still prints).")
    ] = False,
) -> None:
    """Fetch every file TASKS reference (download steps, cloud_file getters) into the file cache, once.

    Files land under OSWorld's cache names in <cache-dir>/<task_id>/, where the local backend (its cache_dir option) and `legato tasks check --cache-dir` find them; collection then runs offline. A file already there is skipped without a request (--verify: a HEAD checks its size); a partial file (<name>.part) is resumed with a Range request; sizes are checked against the Content-Length. URLs on huggingface.co are fetched from $HF_ENDPOINT when it is set (a mirror, e.g. https://hf-mirror.com), same path.

    Exit status: 0 when every file is in the cache; 1 when some could not be fetched (each is named with the reason, after everything else was fetched); 2 when the task list is bad.
    """
    import asyncio
    import os

    from pydantic import ValidationError

    from ..osworld_format.fetch import CacheSettings, fill_cache
    from .progress import CacheProgress

    try:
        task_set = _load_task_list(tasks, osworld)
    except TaskListError as exc:
        fail(str(exc))
    try:
        settings = CacheSettings(
            cache_dir=(cache_dir or default_cache_dir()).expanduser(),
            jobs=jobs,
            attempts=attempts,
            timeout_s=timeout,
            verify=verify,
        )
    except ValidationError as exc:
        fail(str(exc))
    endpoint = settings.hub_endpoint()
    if endpoint:
        err.print(f"huggingface.co URLs from {escape(endpoint)} (${ENDPOINT_ENV})", highlight=False)
    progress = None if no_progress else CacheProgress(console=err)
    try:
        if progress is None:
            report = asyncio.run(fill_cache(task_set, settings))
        else:
            with progress:
                report = asyncio.run(fill_cache(task_set, settings, progress=progress))
    except OSError as exc:
        fail(f"cache dir {settings.cache_dir}: {exc}")
    for result in report.failed:
        refs = "; ".join(result.refs[:3]) + (" ..." if len(result.refs) > 3 else "")
        where = f" from {result.fetched_from}" if result.fetched_from != result.url else ""
        err.print(
            f"[bold red]error:[/] {escape(result.url)}{escape(where)}: {escape(result.error or '')} "
            f"[dim](needed by {escape(refs)}; would be {escape(os.pathsep.join(result.paths))})[/]",
            highlight=False,
        )
    console.print(report.summary(), highlight=False)
    if report.failed:
        raise typer.Exit(1)
