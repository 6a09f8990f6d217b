"""``legato view RUN_DIR | --lake LAKE --version V``: the static HTML report of a batch.

Writes ``index.html`` (every rollout; filter by task and status, sort by reward), one page per
rollout (screenshots with the actions drawn on them, responses, timings, tokens, setup facts,
the evaluator's result) and one per GRPO group (:mod:`legato_pipelines.view`). The report opens
from disk; ``--serve`` also serves it on loopback until Ctrl-C.
"""

from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path
from typing import Annotated

import typer

from .console import console, fail
from .root import app


@app.command("view")
def view_command(
    run_dir: Annotated[
        Path | None, typer.Argument(help="A run directory (the --out of legato collect).")
    ] = None,
    lake: Annotated[
        str | None,
        typer.Option(
            "--lake",
            help="Lake root: report the run directory of --version in it (default $LEGATO_LAKE, "
            "else the lake legato demo writes).",
        ),
    ] = None,
    version: Annotated[
        str | None, typer.Option("--version", help="Policy version (partition key) in the lake.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Report directory; default <run dir>/report.")
    ] = None,
    self_contained: Annotated[
        bool,
        typer.Option(
            "--self-contained",
            help="Copy the screenshots used into the report (default: refer to the run's images/).",
        ),
    ] = False,
    serve: Annotated[
        bool, typer.Option("--serve", help="Serve the report on loopback until Ctrl-C.")
    ] = False,
    port: Annotated[int, typer.Option("--port", help="Port for --serve (0: any free port).")] = 0,
) -> None:
    """Write a static HTML report of a batch's rollouts (opens from disk, no server needed)."""
    from ..errors import LegatoError
    from ..view import write_report

    if run_dir is not None and version is not None:
        fail("pass a RUN_DIR or --version (with --lake), not both")
    if run_dir is None:
        if version is None:
            fail("pass a RUN_DIR, or --version V (and --lake LAKE) for a lake's run directory")
        from ..store.lake import RUNS_DIR, Lake
        from ..store.rundir import RUN_META
        from ..versions import check_version_key
        from .demo import default_lake

        try:
            check_version_key(version)
        except LegatoError as exc:
            fail(f"--version: {exc}")
        try:
            store = Lake(lake) if lake else Lake(default_lake())
            run_dir = store.pull_run(version)
            if not (run_dir / RUN_META).is_file():
                known = store.versions(RUNS_DIR, file=RUN_META)
                fail(
                    f"--version {version!r}: no such version in the lake {store.root} "
                    f"(versions: {', '.join(known) or 'none yet'}; fix: one of them, or --lake)"
                )
        except LegatoError as exc:
            fail(str(exc))
    try:
        report = write_report(run_dir, out, self_contained=self_contained)
    except LegatoError as exc:
        fail(str(exc))
    console.print(
        f"report: {report.index}  ({report.rollouts} rollouts, {report.groups} groups; "
        f"index {report.index_s:.2f} s, all pages {report.total_s:.2f} s)",
        highlight=False,
    )
    console.print(f"open it: file://{report.index}", highlight=False)
    if serve:
        serve_report(report.out, Path(run_dir).resolve(), port)


def serve_report(root: Path, run_dir: Path, port: int = 0) -> None:
    """Serve the smallest tree holding the report ``root`` and ``run_dir``'s ``images/`` (the
    pages link to them) on 127.0.0.1 until Ctrl-C."""
    base = Path(os.path.commonpath([root, run_dir]))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(base))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    rel = root.relative_to(base).as_posix()
    url = f"http://127.0.0.1:{server.server_address[1]}/{rel + '/' if rel != '.' else ''}index.html"
    console.print(f"serving: {url}  (Ctrl-C to stop)", highlight=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
