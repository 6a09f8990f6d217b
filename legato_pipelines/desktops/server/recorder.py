"""The desktop's web recorder: mitmproxy's ``mitmdump`` between the desktop's Chromium and the
websites, per attempt (issue 34; docs/local-desktop.md §15).

Modes (desktop option ``web``, server flag ``--web``):

- ``record:ARCHIVE``: every HTTP(S) exchange of the attempt (setup, policy, grader: everything
  Chromium fetches) is written by ``mitmdump -w`` and, when the attempt ends (the next
  attempt's start or the server's stop), moved to ``ARCHIVE/<task_id>.flows`` (mitmproxy's
  flow file), replacing an earlier recording of the task. Upstream: the sites directly, or
  the configured proxy (``--mode upstream:``).
- ``replay:ARCHIVE``: ``mitmdump --server-replay ARCHIVE/<task_id>.flows`` answers from the
  archive (``server_replay_reuse``: a response may serve several requests; requests match
  on scheme, method, Host, path, query and body, not the port), connects to no
  server (``connection_strategy=lazy``, ``upstream_cert=false``), and the addon
  (:mod:`.web_addon`) answers 404 to what the archive lacks and lists it: the attempt's
  misses (:meth:`WebRecorder.misses`).

``mitmdump`` runs on the host, as root without capabilities (``setpriv``: the web venv lives
in root's cache), in the desktop's network namespace (``nsenter --net``: its sandbox's own, or
the host's for ``network=host``), listening on ``127.0.0.1:<port>`` there; the desktop's
``google-chrome`` gets ``--proxy-server`` to it and trusts the recorder's CA (an NSS database
in the baseline HOME: :func:`trust_cas`). The CA lives in ``legato_cache("web-ca")`` (root's,
0700), made once by mitmproxy itself; its key never enters the sandbox.

Stdlib only (the desktop server imports it): mitmproxy runs in its own venv
(``scripts/web_venv.sh``, ``LEGATO_WEB_VENV``, default ``legato_cache("web-venv")``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from ...user_cache import legato_cache

VENV_ENV = "LEGATO_WEB_VENV"
#: mitmproxy's CA files in its confdir (mitmproxy's own names).
CA_CERT = "mitmproxy-ca-cert.pem"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
MODES = ("live", "record", "replay")
ADDON = Path(__file__).with_name("web_addon.py")


class RecorderError(RuntimeError):
    """The recorder cannot start (no web venv, mitmdump exited or did not listen)."""


def web_venv() -> Path:
    """The web venv (``LEGATO_WEB_VENV``, else ``legato_cache("web-venv")``)."""
    return Path(os.environ.get(VENV_ENV) or legato_cache("web-venv"))


def mitmdump() -> Path | None:
    """The venv's ``mitmdump`` when installed (``scripts/web_venv.sh``), else ``None``."""
    path = web_venv() / "bin" / "mitmdump"
    return path if os.access(path, os.X_OK) else None


def ca_dir() -> Path:
    """The recorder's CA folder (mitmproxy's ``confdir``), made with mitmproxy's own
    ``CertStore`` on first use (root's, 0700). Raises :class:`RecorderError` without the
    venv or when mitmproxy fails."""
    folder = legato_cache("web-ca")
    if (folder / CA_CERT).is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    python = web_venv() / "bin" / "python"
    code = "import sys; from mitmproxy.certs import CertStore; CertStore.from_store(sys.argv[1], 'mitmproxy', 2048)"
    try:
        subprocess.run(
            [str(python), "-c", code, str(folder)], check=True, capture_output=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RecorderError(f"cannot make the recorder's CA with {python}: {exc}") from None
    return folder


def trust_cas(home: Path, certs: Sequence[Path], uid: int | None, gid: int | None) -> None:
    """An NSS database ``home/.pki/nssdb`` (what Chromium on Linux reads) trusting ``certs``
    (PEM files) as certificate authorities for websites, owned by ``uid``/``gid``. Needs
    ``certutil`` (package ``libnss3-tools``); raises :class:`RecorderError` naming it."""
    if not certs:
        return
    if shutil.which("certutil") is None:
        raise RecorderError(
            "trusting a CA in the desktops' Chromium needs certutil (apt-get install libnss3-tools)"
        )
    db = home / ".pki" / "nssdb"
    db.mkdir(parents=True, exist_ok=True)
    run = [["certutil", "-d", f"sql:{db}", "-N", "--empty-password"]]
    run += [
        ["certutil", "-d", f"sql:{db}", "-A", "-t", "C,,", "-n", f"legato-{i}", "-i", str(c)]
        for i, c in enumerate(certs)
    ]
    for argv in run:
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RecorderError(f"{' '.join(argv[:4])} failed: {done.stderr.strip()[-300:]}")
    if uid is not None:
        for path in [home / ".pki", db, *db.iterdir()]:
            os.chown(path, uid, gid if gid is not None else uid)


def archive_file(archive: Path, task_id: str) -> Path:
    """``archive/<task_id>.flows``; raises ``ValueError`` for an id that is no file name."""
    if not task_id or "/" in task_id or task_id.startswith("."):
        raise ValueError(f"task id {task_id!r} cannot name an archive file")
    return archive / f"{task_id}.flows"


class WebRecorder:
    """One desktop's recorder (module docstring): ``mode`` ``record`` or ``replay``,
    ``archive`` the folder of flow files, ``work`` a folder of the server's own, ``port`` the
    port it listens on inside the desktop's network, ``upstream`` a proxy URL (record),
    ``hosts`` ``{name: "addr:port"}`` (:mod:`.web_addon`), ``trusted`` PEM files mitmproxy
    trusts for the sites besides the system's (stand-ins' CAs, a TLS-inspecting proxy's)."""

    def __init__(
        self,
        mode: str,
        archive: Path,
        work: Path,
        port: int,
        *,
        upstream: str | None = None,
        hosts: dict[str, str] | None = None,
        trusted: Sequence[Path] = (),
    ):
        if mode not in ("record", "replay"):
            raise ValueError(f"recorder mode must be record or replay, got {mode!r}")
        self.mode, self.archive, self.work, self.port = mode, Path(archive), Path(work), port
        self.upstream, self.hosts, self.trusted = upstream, dict(hosts or {}), list(trusted)
        self.task: str | None = None
        self._proc: subprocess.Popen | None = None

    def begin(self, task_id: str, netns_pid: int | None) -> dict:
        """End the running attempt (:meth:`end`) and start ``mitmdump`` for ``task_id`` in the
        network namespace of process ``netns_pid`` (``None``: this process's); returns
        ``{"mode", "task", "archived"}`` (``archived``: replay has a recording of the task).
        Blocks until it listens. Raises :class:`RecorderError`, ``ValueError`` for a bad id."""
        self.end()
        flows = archive_file(self.archive, task_id)
        exe = mitmdump()
        if exe is None:
            raise RecorderError(
                f"desktop option web={self.mode}: mitmproxy is not installed in {web_venv()} (fix: scripts/web_venv.sh)"
            )
        confdir = ca_dir()
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o700)
        for name in ("flows", "misses.jsonl", "trusted.pem"):
            (self.work / name).unlink(missing_ok=True)
        argv = [str(exe), "-q", "--listen-host", "127.0.0.1", "--listen-port", str(self.port)]
        argv += ["--set", f"confdir={confdir}", "-s", str(ADDON)]
        argv += ["--set", f"legato_hosts={json.dumps(self.hosts)}"]
        if self.trusted:
            bundle = self.work / "trusted.pem"
            system = Path("/etc/ssl/certs/ca-certificates.crt")
            parts = [system.read_bytes()] if system.is_file() else []
            bundle.write_bytes(b"\n".join(parts + [Path(p).read_bytes() for p in self.trusted]))
            argv += ["--set", f"ssl_verify_upstream_trusted_ca={bundle}"]
        archived = False
        if self.mode == "record":
            argv += ["-w", str(self.work / "flows")]
            if self.upstream:
                argv += ["--mode", f"upstream:{self.upstream}"]
        else:
            archived = flows.is_file()
            if archived:
                argv += ["--server-replay", str(flows)]
            argv += ["--set", "server_replay_extra=forward", "--set", "server_replay_reuse=true"]
            # a site of web_hosts was recorded at its mapped port (mitmproxy takes the
            # request's port from the server address); the Host header still names it
            argv += ["--set", "server_replay_ignore_port=true"]
            argv += ["--set", "connection_strategy=lazy", "--set", "upstream_cert=false"]
            argv += ["--set", f"legato_misses={self.work / 'misses.jsonl'}"]
        enter = ["nsenter", f"--net=/proc/{netns_pid}/ns/net"] if netns_pid else []
        drop = ["setpriv", "--pdeathsig", "KILL", "--inh-caps=-all", "--bounding-set=-all", "--"]
        self._proc = subprocess.Popen(
            [*enter, *drop, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.task = task_id
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.port not in _listening(self._proc.pid):
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace").strip()[-500:]
                self._proc, self.task = None, None
                raise RecorderError(f"mitmdump exited: {err or 'no message'}")
            if time.monotonic() > deadline:
                self.end()
                raise RecorderError(
                    f"mitmdump did not listen on port {self.port} in {START_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.02)
        return {"mode": self.mode, "task": task_id, "archived": archived}

    def misses(self) -> list[dict]:
        """The running replay attempt's requests the archive did not answer (``{"method",
        "url"}``, in order); ``[]`` when recording or none ran."""
        path = self.work / "misses.jsonl"
        if self.mode != "replay" or self.task is None or not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def end(self) -> None:
        """Stop the running attempt's ``mitmdump`` (SIGTERM: mitmproxy writes and closes its
        flow file) and, recording, move its flows to ``ARCHIVE/<task>.flows`` (replacing the
        task's earlier recording; atomically). Nothing when none runs."""
        proc, task = self._proc, self.task
        self._proc = None
        if proc is None:
            return
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        flows = self.work / "flows"
        if self.mode == "record" and task is not None and flows.is_file():
            target = archive_file(self.archive, task)
            self.archive.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.partial")
            shutil.copyfile(flows, partial)
            os.replace(partial, target)
            flows.unlink()


def _listening(pid: int) -> set[int]:
    """TCP ports ``pid`` listens on (IPv4), read in its own network namespace
    (``/proc/PID/net/tcp``)."""
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return set()
    return {
        int(f[1].rsplit(":", 1)[1], 16)
        for f in (line.split() for line in lines)
        if f[3] == "0A" and f[9] in inodes
    }
