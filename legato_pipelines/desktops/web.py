"""Live websites on local desktops: does the desktop's network reach outside, and through
which proxy (issue 34; docs/local-desktop.md §15).

A sandboxed desktop on ``network=own`` or ``network=host`` reaches whatever this host reaches
(docs/sandbox.md §1), so a task that opens a live website runs there when the host has a route
out; on ``network=none`` it has none. Whether the host has one is a *reachability check* run
once per process (:func:`reachable`: a TCP connection to the probe address, and on port 443 a
verified TLS handshake, or a TCP connection to the proxy when one is set, within
:data:`PROBE_TIMEOUT_S`), which ``legato tasks check`` and collect's
preflight make through :func:`route_out`.

Settings (desktop options of the ``local`` backend, with an environment default):

- ``proxy`` (``LEGATO_PROXY``): the upstream proxy Chromium uses (``--proxy-server``) on every
  sandboxed desktop, ``http://HOST:PORT`` (also ``https://``, ``socks4://``, ``socks5://``).
  OSWorld runs the tasks whose config says ``proxy: true`` through a proxy (sites block
  automated browsers); the verdict refuses such a task on a route out when none is set.
  Chromium takes no credentials in ``--proxy-server``, and everything on its command line is
  visible to the desktop's processes, so a URL holding ``user:password@`` is refused.
- ``web_probe`` (``LEGATO_WEB_PROBE``): ``HOST:PORT`` the reachability check connects to
  (default :data:`DEFAULT_PROBE`).
- ``web``: ``live`` (default), ``record:ARCHIVE`` or ``replay:ARCHIVE``: mitmproxy between the
  desktop's Chromium and the sites, one flow file per task in the folder ARCHIVE
  (``desktops/server/recorder.py``). Replay serves the archive and reaches no site: a task
  whose live sites are recorded there runs with no route out; what the archive lacks is
  answered 404 and noted on the attempt (:data:`WEB_MISS_NOTE`).
- ``web_hosts``: ``{name: "addr[:port]"}``, sites served at another address (stand-ins,
  mirrors); ``web_ca``: PEM files of CAs the desktops' Chromium and the recorder trust.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import ipaddress
import os
import socket
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError

#: Environment defaults of the desktop options ``proxy`` and ``web_probe``.
PROXY_ENV = "LEGATO_PROXY"
PROBE_ENV = "LEGATO_WEB_PROBE"
#: What the reachability check connects to without ``web_probe``: the host huggingface.co,
#: where every file of OSWorld's tasks lives (docs/osworld.md §10).
DEFAULT_PROBE = "huggingface.co:443"
#: Seconds the reachability check waits (name lookup and TCP handshake together).
PROBE_TIMEOUT_S = 3.0
PROXY_SCHEMES = ("http", "https", "socks4", "socks5")
WEB_MODES = ("live", "record", "replay")
#: The kind of the evaluation note listing a replay's requests the archive lacked.
WEB_MISS_NOTE = "web_replay_missing"


@dataclasses.dataclass(frozen=True)
class WebSettings:
    """The web settings of a local desktop batch (module docstring): ``proxy`` checked by
    :func:`proxy_url` (``None``: no proxy) and ``probe`` ``(host, port)``. A dataclass, not a
    pydantic model: the desktop server imports this module and no pydantic
    (tests/test_package_imports.py)."""

    proxy: str | None = None
    probe: tuple[str, int] = ("huggingface.co", 443)
    mode: str = "live"
    archive: Path | None = None
    hosts: tuple[tuple[str, str], ...] = ()
    cas: tuple[Path, ...] = ()

    def archived(self, task_id: str) -> bool:
        """Replay: the archive holds a recording of ``task_id``."""
        return self.archive is not None and (self.archive / f"{task_id}.flows").is_file()


def _host_port(text: str, field: str, fix: str) -> tuple[str, int]:
    parts = urlsplit(f"//{text}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise ConfigError(f"desktop option {field!r} must be HOST:PORT, got {text!r} (fix: {fix})")
    return parts.hostname, port


def proxy_url(value: Any) -> str | None:
    """The proxy URL of desktop option ``proxy`` (or :data:`PROXY_ENV`; ``None``/``""``:
    none), checked: scheme one of :data:`PROXY_SCHEMES`, a host and a port, no credentials,
    no path or query. Raises ``ConfigError`` naming the option and the fix; the value itself
    is never echoed (a URL without a scheme, ``user:pass@host:port``, or with a ``?token=``
    query holds a secret the check cannot tell apart)."""
    if value in (None, ""):
        return None
    field = f"desktop option 'proxy' (or {PROXY_ENV})"
    fix = "fix: proxy=http://10.0.0.5:3128"
    if not isinstance(value, str):
        raise ConfigError(f"{field} must be a URL string, got {type(value).__name__}")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:  # a bad port, an unclosed [IPv6 bracket
        raise ConfigError(f"{field} is not a valid URL: SCHEME://HOST:PORT ({fix})") from None
    if parts.username is not None or parts.password is not None or "@" in value:
        raise ConfigError(
            f"{field} holds credentials (user:password@): Chromium's"
            " --proxy-server takes none and the desktop's processes would read them (fix: a"
            " proxy that needs no credentials from this host, e.g. a local forwarder)"
        )
    if parts.scheme not in PROXY_SCHEMES or not parts.hostname or port is None:
        raise ConfigError(
            f"{field} must be SCHEME://HOST:PORT with SCHEME one of"
            f" {', '.join(PROXY_SCHEMES)} (the value is not shown: it may hold a secret; {fix})"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(
            f"{field} must have no path or query (the value is not shown: it may hold a"
            f" secret; {fix})"
        )
    return f"{parts.scheme}://{parts.netloc}"


def web_settings(options: dict[str, Any] | None) -> WebSettings:
    """:class:`WebSettings` from desktop ``options`` ``proxy`` and ``web_probe``, each
    defaulting to its environment variable (:data:`PROXY_ENV`, :data:`PROBE_ENV`). Raises
    ``ConfigError`` for a malformed value."""
    options = options or {}
    proxy = options["proxy"] if "proxy" in options else os.environ.get(PROXY_ENV)
    probe = options.get("web_probe") or os.environ.get(PROBE_ENV) or DEFAULT_PROBE
    web = str(options.get("web") or "live")
    mode, _, archive = web.partition(":")
    if mode not in WEB_MODES or (mode != "live") != bool(archive):
        raise ConfigError(
            f"desktop option 'web' must be live, record:ARCHIVE or replay:ARCHIVE, got {web!r}"
            " (fix: --web replay:/path/to/archive)"
        )
    hosts = options.get("web_hosts") or {}
    cas = options.get("web_ca") or []
    if not isinstance(hosts, dict) or not all(isinstance(v, str) for v in hosts.values()):
        raise ConfigError(
            f"desktop option 'web_hosts' must map names to 'addr[:port]', got {hosts!r}"
        )
    if isinstance(cas, str):
        cas = [cas]
    missing = [c for c in cas if not Path(str(c)).expanduser().is_file()]
    if missing:
        raise ConfigError(f"desktop option 'web_ca': no such PEM file {missing[0]!r}")
    if mode == "replay" and not Path(archive).expanduser().is_dir():
        raise ConfigError(
            f"desktop option 'web': the replay archive {archive!r} is not a folder (fix: `legato"
            f" web record TASKS --archive {archive}` first, or --web live)"
        )
    return WebSettings(
        proxy=proxy_url(proxy),
        probe=_host_port(str(probe), "web_probe", "web_probe=example.org:443"),
        mode=mode,
        archive=Path(archive).expanduser().resolve() if archive else None,
        hosts=tuple(sorted((str(k), v) for k, v in hosts.items())),
        cas=tuple(Path(str(c)).expanduser().resolve() for c in cas),
    )


def web_server_args(settings: WebSettings) -> list[str]:
    """The desktop server's flags for ``settings``' web mode, sites and CAs
    (``python -m legato_pipelines.desktops.server.main --web ...``)."""
    argv = []
    if settings.mode != "live":
        argv += ["--web", f"{settings.mode}:{settings.archive}"]
    for name, addr in settings.hosts:
        argv += ["--web-host", f"{name}={addr}"]
    for ca in settings.cas:
        argv += ["--web-ca", str(ca)]
    return argv


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _connects(host: str, port: int) -> bool:
    """A TCP handshake with ``host:port``; on port 443 also a TLS handshake verifying the
    site's certificate for ``host`` (the system's CAs): a network that accepts every TCP
    connection (a transparent firewall; this project's CI machine does) passes the first alone."""
    try:
        sock = socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S)
    except OSError:
        return False
    try:
        if port == 443:
            ssl.create_default_context().wrap_socket(sock, server_hostname=host).close()
    except (OSError, ssl.SSLError):
        return False
    finally:
        sock.close()
    return True


@functools.lru_cache(maxsize=16)
def reachable(host: str, port: int) -> bool:
    """True when this host opens a TCP connection to ``host:port`` within
    :data:`PROBE_TIMEOUT_S` seconds (name lookup included); asked once per process and
    address (cached)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(_connects, host, port).result(timeout=PROBE_TIMEOUT_S + 0.5)
    except concurrent.futures.TimeoutError:
        return False
    finally:
        pool.shutdown(wait=False)


def route_out(network: str | None, settings: WebSettings) -> tuple[bool, str]:
    """``(True, "")`` when sandboxed desktops on ``network`` (``auto``, ``own``, ``host``,
    ``none``; ``None``: servers attached by URL, which chose their own) reach outside through
    ``settings``' proxy, or directly, else ``(False, why)``. ``auto`` counts as ``own``: a
    batch holding a task that needs a network gets ``own`` (``desktops/network.py``).
    ``own`` desktops do not reach this host's loopback, so a proxy there is no way out for
    them."""
    if network == "none":
        return False, "network=none: a loopback of its own and nothing else"
    if settings.proxy:
        parts = urlsplit(settings.proxy)
        host, port = parts.hostname or "", int(parts.port or 0)
        if network in ("auto", "own") and _is_loopback(host):
            return False, (
                f"the proxy {host}:{port} is on this host's loopback, which network={network}"
                " desktops do not reach (docs/sandbox.md §4)"
            )
        if not reachable(host, port):
            return False, f"this host does not reach the proxy {host}:{port}"
        return True, ""
    host, port = settings.probe
    if network in ("auto", "own") and _is_loopback(host):
        return False, f"the probe {host}:{port} is on this host's loopback (network={network})"
    if not reachable(host, port):
        return False, (
            f"the reachability check found no way to {host}:{port} from this host (set"
            f" desktop option web_probe or {PROBE_ENV} to a site it should reach)"
        )
    return True, ""


def chromium_flags(settings: WebSettings) -> list[str]:
    """Flags the desktops' ``google-chrome`` wrapper adds for ``settings``
    (``desktops/server/chrome.py``): ``--proxy-server`` when a proxy is set."""
    return [f"--proxy-server={settings.proxy}"] if settings.proxy else []
