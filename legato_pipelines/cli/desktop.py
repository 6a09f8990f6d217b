"""``legato desktop serve``: run local desktop servers (Xvfb + openbox + apps) for collectors.

Each desktop is one server process on its own port (``--port-start``, ``+1``, ...) speaking
OSWorld's in-VM API plus ``/legato/``; collectors attach with ``DesktopConfig(backend="local",
options={"urls": [...]})`` and the same token in ``LEGATO_DESKTOP_TOKEN``. The token comes
from that environment variable; when it is unset a random one is generated and written to a
file readable only by you (``--token-file``), whose path is printed (the token itself never
is). A local desktop is not a sandbox against a hostile policy: use VMs for that.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import secrets
import signal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ..desktops.server.desktop import NETWORKS, ServerProcess, limits_option, session_option
from ..desktops.server.wire import DEFAULT_TOKEN_ENV, READY_SOURCES
from ..errors import ConfigError, LegatoError
from .console import console, fail
from .console import err as _err
from .root import app

desktop_app = typer.Typer(
    rich_markup_mode=None,  # help texts hold units in brackets ([s], [tokens]): not markup
    help="Local desktops on Xvfb (one server process per desktop).",
    no_args_is_help=True,
)
app.add_typer(desktop_app, name="desktop")

WATCH_INTERVAL_S = 2.0


def _token(token_file: Path) -> tuple[str, Path | None]:
    """The token from the environment, else the one already in ``token_file`` (so a second
    ``serve`` on the host does not invalidate the first one's token), else a new one written
    there (mode 0600)."""
    token = os.environ.get(DEFAULT_TOKEN_ENV, "")
    if token:
        return token, None
    if token_file.is_file() and (existing := token_file.read_text().strip()):
        return existing, token_file
    token = secrets.token_urlsafe(32)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(token_file, 0o600)
    return token, token_file


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@desktop_app.command("serve")
def serve(
    count: Annotated[int, typer.Option(min=1, help="How many desktops (server processes).")] = 1,
    host: Annotated[
        str, typer.Option(help="Address to listen on (loopback by default).")
    ] = "127.0.0.1",
    port_start: Annotated[
        int, typer.Option(min=1, max=65535, help="Port of the first desktop; the others follow.")
    ] = 5000,
    width: Annotated[int, typer.Option(min=64, help="Screen width in pixels.")] = 1280,
    height: Annotated[int, typer.Option(min=64, help="Screen height in pixels.")] = 720,
    sandbox: Annotated[
        bool,
        typer.Option(
            help="Each desktop in its own sandbox (namespaces; OSWorld's user, /home/user, sudo"
            " inside; needs root). --no-sandbox: the task's processes run on this host as --user,"
            " with no isolation from what that user can read."
        ),
    ] = True,
    network: Annotated[
        str | None,
        typer.Option(
            help="Sandboxed desktops' network: own (the default: a network of their own with a"
            " route out and Chrome's and VLC's OSWorld ports forwarded from free host ports,"
            " nothing of this host's loopback; needs pasta, apt-get install passt); none (a"
            " loopback of their own); or host (this host's, its loopback services included:"
            " a warning is printed). Unsandboxed desktops are on the host's network."
        ),
    ] = None,
    limits: Annotated[
        str,
        typer.Option(
            help="Sandboxed desktops' resource caps (JSON): true (memory 4g, pids 2048, disk 8g,"
            " cpus half the host's, cpu_weight and io_weight 100), an object overriding some"
            " ('{\"pids\": 1024}'), or false (uncapped: a fork bomb or memory hog inside reaches"
            " the host)."
        ),
    ] = "true",
    session: Annotated[
        str,
        typer.Option(
            help="The desktop session: plain (openbox on black) or vm (OSWorld's VM look: a"
            " GNOME-like top bar and dock, Yaru; docs/local-desktop.md §18)."
        ),
    ] = "plain",
    ready_source: Annotated[
        str,
        typer.Option(
            help="Source of the ready wait when a request names none: damage (the X server's"
            " drawing reports; frame polling where the X server lacks DAMAGE) or poll (frame"
            " polling only, docs/local-desktop.md §6)."
        ),
    ] = "damage",
    user: Annotated[
        str,
        typer.Option(help="Unsandboxed desktops run as root: the host user (created if missing)."),
    ] = "legato-desktop",
    prebuild: Annotated[
        list[str] | None,
        typer.Option(
            help=(
                "Copy this app's pre-built profile into each baseline HOME: libreoffice (the"
                " default when installed; built once and cached), or none."
            )
        ),
    ] = None,
    token_file: Annotated[
        Path,
        typer.Option(help=f"Where a generated token is written when {DEFAULT_TOKEN_ENV} is unset."),
    ] = Path.home() / ".config" / "legato" / "desktop.token",
) -> None:
    """Start COUNT desktops and serve them until Ctrl-C; restart any that dies."""
    if network is None:  # the served desktops' tasks are not known: own works for any
        network = "own" if sandbox else "host"
    if network not in NETWORKS:
        fail(f"--network must be one of {', '.join(NETWORKS)}, got {network!r}")
    if network != "host" and not sandbox:
        fail(f"--network {network} needs the sandbox (drop --no-sandbox)")
    if network == "host" and sandbox:
        from ..desktops.network import HOST_WARNING

        _err.print(f"[yellow]warning: {HOST_WARNING}[/]")
    if ready_source not in READY_SOURCES:
        fail(f"--ready-source must be one of {', '.join(READY_SOURCES)}, got {ready_source!r}")
    try:
        caps = limits_option(json.loads(limits))
    except (json.JSONDecodeError, ConfigError) as exc:
        fail(f"--limits: {exc}")
    try:
        session = session_option(session)
    except ConfigError as exc:
        fail(f"--session: {exc}")
    token, written = _token(token_file)
    if not _is_loopback(host):
        _err.print(
            f"[yellow]warning:[/] listening on {host}: plain HTTP, the token is the only protection"
        )
    try:
        asyncio.run(
            _serve(
                count,
                host,
                port_start,
                width,
                height,
                user,
                _prebuild(prebuild),
                token,
                written,
                sandbox,
                network,
                ready_source,
                caps,
                session,
            )
        )
    except LegatoError as exc:  # e.g. a server that could not start (port taken, no Xvfb)
        fail(str(exc), code=1)


def _prebuild(apps: list[str] | None) -> tuple[str, ...] | None:
    """``--prebuild`` as :class:`ServerProcess` takes it: ``None`` (not given: the server's
    default), ``()`` for ``none``; exits naming the flag on an unknown app."""
    if apps is None:
        return None
    unknown = sorted(set(apps) - {"libreoffice", "none"})
    if unknown:
        fail(f"--prebuild must be libreoffice or none, got {', '.join(unknown)}")
    if "none" in apps and len(set(apps)) > 1:
        fail("--prebuild none cannot be combined with an app (drop one of them)")
    return tuple(a for a in apps if a != "none")


async def _serve(
    count: int,
    host: str,
    port_start: int,
    width: int,
    height: int,
    user: str,
    prebuild: tuple[str, ...] | None,
    token: str,
    written: Path | None,
    sandbox: bool = True,
    network: str = "own",
    ready_source: str = "damage",
    limits: Any = True,
    session: str = "plain",
) -> None:
    servers = [
        ServerProcess(
            width=width,
            height=height,
            host=host,
            port=port_start + i,
            user=user,
            prebuild=prebuild,
            token=token,
            sandbox=sandbox,
            network=network,
            ready_source=ready_source,
            limits=limits,
            session=session,
        )
        for i in range(count)
    ]
    if written is not None:
        _err.print(
            f"token written to {written} (mode 0600): export {DEFAULT_TOKEN_ENV}=$(cat {written})"
        )
    else:
        _err.print(f"token: from {DEFAULT_TOKEN_ENV}")
    # SIGINT cancels the main task already (asyncio.run); SIGTERM should too, so servers stop.
    main = asyncio.current_task()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    try:
        await asyncio.gather(*(s.start() for s in servers))
        table = Table(title=f"{count} local desktop(s), {width}x{height}")
        table.add_column("desktop")
        table.add_column("url")
        table.add_column("server pid")
        for i, s in enumerate(servers):
            table.add_row(f"local-{i}", s.url, str(s.pid))
        console.print(table)
        if network == "own":  # the host ports DesktopEnv needs as chromium_port / vlc_port
            for i, s in enumerate(servers):
                _err.print(f"local-{i}: CDP / VLC port {s.ports}")
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            for i, s in enumerate(servers):
                if not s.alive():
                    _err.print(f"[yellow]local-{i} ({s.url}) died; restarting[/]")
                    await s.stop()
                    await s.start()
                    if network == "own":  # new host ports for the new server
                        _err.print(f"local-{i}: CDP / VLC port {s.ports}")
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass
    finally:
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
