"""The desktop's web recorder, per attempt (issue 34; docs/local-desktop.md §15): a proxy between
the desktop's Chromium and the websites.

Modes (desktop option ``web``, server flag ``--web``):

- ``record:ARCHIVE``: ``legato-web-recorder`` (``web_recorder/main.go``: Go's net/http server
  and reverse proxy, certificates by Google's martian/mitm; built into the web venv by
  ``scripts/web_venv.sh``) forwards every HTTP(S) exchange of the attempt (setup, policy,
  grader: everything Chromium fetches), answers passed on as they arrive, and writes each as
  it finishes: a JSON line (:data:`EXCHANGES`) and its bodies as they crossed the wire
  (:data:`BODIES`; a copy of an answer is kept while it passes, up to :data:`MAX_BODY_MIB`).
  At the attempt's end (the next attempt's start or the server's stop) the recorder stops
  (SIGTERM) and :mod:`.web_exchanges`, run by the web venv's interpreter, confined alike,
  turns them into mitmproxy's flow file (what ``mitmdump -w`` writes); the file
  is then moved to ``ARCHIVE/<task_id>.flows``, replacing an earlier recording of the task.
  Upstream: the sites directly, or the configured proxy (``-upstream``). mitmdump itself
  recorded before: 1.2-2.1 ms of CPU per request inside the steps against ~0.25 ms for this
  (BENCHMARKS.md, issue 34).
- ``replay:ARCHIVE``: ``mitmdump --server-replay ARCHIVE/<task_id>.flows`` answers from the
  archive (each recorded answer once, in order, then the last one again; requests match on
  scheme, method, Host, path, query and body, forms field by field, not the port), connects
  to no server (``connection_strategy=lazy``, ``upstream_cert=false``; a tunnel carrying no
  HTTP is killed), and the addon (:mod:`.web_addon`) answers 404 to what the archive lacks
  and lists it: the attempt's misses (:meth:`WebRecorder.misses`).

The recorder speaks HTTP/2 to Chromium and to the sites that offer it, HTTP/1.1 otherwise, as
Chromium would live (an HTTP/1.1-only proxy changed how a page of an HTTP/2 site loads: six
connections, images in rounds). The replay speaks HTTP/1.1 (``http2=false``: mitmproxy's
HTTP/2 cost a third more of its CPU per request).

The recorder parses every byte the desktop's Chromium (and so a possibly hostile policy) sends,
so it runs confined (docs/sandbox.md §7), replaying and recording alike, and so does the
conversion: in the desktop's network namespace (``nsenter --net``: its sandbox's own, or the
host's for ``network=host``), listening on ``127.0.0.1:<port>`` there, under ``bwrap``
(bubblewrap; :func:`confined_argv`) in mount, pid, IPC and UTS namespaces of its own whose root
is a read-only tmpfs holding read-only ``/usr``, ``/etc``, the web venv and its base
interpreter's prefix (at their own paths), a private copy of the CA (``/legato/conf``, root's,
readable by the recorder's group, not writable), its inputs (``/legato/in``: the addon, the
converter, the trusted bundle, the task's archive file copied), its own ``/proc``, ``/dev``
(bwrap's: null, zero, random...), ``/tmp`` and, writable, only ``/legato/out`` (the attempt's
exchanges, ``flows`` and ``misses.jsonl``); as :data:`RECORDER_UID` / :data:`RECORDER_GID` (no
account, not root, not the graders' 65537, outside the sandboxes' uid map), no supplementary
group, no capability (bounding set empty), ``no_new_privs`` (``setpriv`` inside). ``/root``,
``/home``, ``/run``, the archive folder and the host CA's folder are not there. The server
(root) reads what it wrote without following links (:func:`_open_regular`). The desktop's
``google-chrome`` gets ``--proxy-server`` to it and trusts the recorder's CA (an NSS database
in the baseline HOME: :func:`trust_cas`). The CA lives in ``legato_cache("web-ca")`` (root's,
0700), made once by mitmproxy itself; its key never enters the desktop's sandbox.

Stdlib only (the desktop server imports it): the recorder and mitmproxy live in the web venv
(``scripts/web_venv.sh``, ``LEGATO_WEB_VENV``, default ``legato_cache("web-venv")``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ...user_cache import legato_cache
from .procs import pidfd_exited

VENV_ENV = "LEGATO_WEB_VENV"
#: mitmproxy's CA files in its confdir (mitmproxy's own names).
CA_CERT = "mitmproxy-ca-cert.pem"
#: The CA's key and certificate in one PEM file (mitmproxy's name): the recorder signs with it.
CA_KEY_AND_CERT = "mitmproxy-ca.pem"
#: The recorder's output in its ``out`` folder: the exchanges, one JSON object a line, and
#: their bodies (raw, at the offsets the lines give).
EXCHANGES = "exchanges.jsonl"
BODIES = "bodies.bin"
START_TIMEOUT_S = 60.0
#: SIGTERM -> SIGKILL (the recorder flushes its last exchanges; mitmdump stops).
STOP_TIMEOUT_S = 30.0
#: The conversion of an attempt's exchanges into the flow file (:mod:`.web_exchanges`): ~1 ms
#: a flow, plus mitmproxy's import (~0.5 s).
CONVERT_TIMEOUT_S = 600.0
#: Recording: a body beyond this (MiB) is not recorded: a request's is answered 502 (the
#: recorder reads it whole before sending it), a response's is passed on and its request
#: becomes a miss on replay (the recorder keeps a copy of each answer while it passes, so a
#: page cannot grow it without bound).
MAX_BODY_MIB = 256
#: Recording: the copies of all answers in flight together (MiB); an answer that would pass
#: it is passed on, not recorded (a page's parallel downloads cannot add up to more).
MAX_HELD_MIB = 1024
#: A form field name no page uses: set as mitmproxy's ``server_replay_ignore_payload_params``,
#: it makes the replay compare forms field by field (a multipart boundary differs each time).
NO_FORM_FIELD = "legato-no-such-field"
#: Replay: at most this many bytes of the misses file are read (a compromised mitmdump could
#: fill it).
MISSES_MAX_BYTES = 1 << 20
#: The recording proxy in the web venv's ``bin`` (``scripts/web_venv.sh`` builds it).
RECORDER_BINARY = "legato-web-recorder"
CONVERTER = Path(__file__).with_name("web_exchanges.py")
#: :mod:`.web_exchanges`' exit status when the attempt had no exchange (``NOTHING``).
NOTHING_RECORDED = 3
MODES = ("live", "record", "replay")
ADDON = Path(__file__).with_name("web_addon.py")
#: The recorder's user and group: no account of the host's, not root, not the graders'
#: (``GRADER_UID`` 65537: a recorder flaw reaches no grader's files or processes), outside the
#: sandboxes' identity map (``0 0 65536``), so no sandbox process is ever them.
RECORDER_UID = 65538
RECORDER_GID = 65538
#: Host directories bound read-only at their own paths inside the recorder's mount namespace;
#: ``/bin``, ``/lib``... follow as links where the host has them as links (merged /usr).
READ_ONLY = ("/usr", "/etc")
TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: The recorder's own folders inside its mount namespace (under the server's ``work``:
#: ``conf``, ``in``, ``out``).
INSIDE = Path("/legato")


class RecorderError(RuntimeError):
    """The recorder cannot start (no web venv, mitmdump exited or did not listen)."""


def web_venv() -> Path:
    """The web venv (``LEGATO_WEB_VENV``, else ``legato_cache("web-venv")``)."""
    return Path(os.environ.get(VENV_ENV) or legato_cache("web-venv"))


def mitmdump() -> Path | None:
    """The venv's ``mitmdump`` when installed (``scripts/web_venv.sh``), else ``None``."""
    path = web_venv() / "bin" / "mitmdump"
    return path if os.access(path, os.X_OK) else None


def web_recorder() -> Path | None:
    """The venv's recording proxy ``legato-web-recorder`` when built (``scripts/web_venv.sh``),
    else ``None``."""
    path = web_venv() / "bin" / RECORDER_BINARY
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
        self._pid: int | None = None
        #: a pidfd of :attr:`_proc`, opened before anything could reap it: readable once it
        #: exited, so :meth:`root_pid` never names a reused pid
        self._pidfd: int | None = None

    def root_pid(self) -> int | None:
        """The pid of the running attempt's recorder process (its ``nsenter``/``bwrap``), or
        ``None``: the desktop server's infrastructure (``Session.services``), which a reset
        does not kill (a SIGKILL lost the exchanges its write buffers held; :meth:`end`
        stops it with SIGTERM at the next attempt's start)."""
        proc, pidfd = self._proc, self._pidfd
        if proc is None or pidfd is None:
            return None
        try:
            exited = pidfd_exited(pidfd)
        except (OSError, ValueError):  # closed by end() meanwhile
            return None
        return None if exited else proc.pid

    def begin(self, task_id: str, netns_pid: int | None) -> dict:
        """End the running attempt (:meth:`end`) and start the recorder (``record``) or
        ``mitmdump`` (``replay``) for ``task_id`` in the network namespace of process
        ``netns_pid`` (``None``: this process's); returns ``{"mode", "task", "archived"}``
        (``archived``: replay has a recording of the task). Blocks until it listens. Raises
        :class:`RecorderError`, ``ValueError`` for a bad id."""
        self.end()
        flows = archive_file(self.archive, task_id)
        exe = web_recorder() if self.mode == "record" else mitmdump()
        if exe is None or mitmdump() is None:
            raise RecorderError(
                f"desktop option web={self.mode}: the web recorder is not installed in {web_venv()} (fix: scripts/web_venv.sh)"
            )
        if shutil.which("bwrap") is None:
            raise RecorderError(
                f"desktop option web={self.mode}: the recorder runs under bwrap (apt-get install bubblewrap)"
            )
        conf, inputs, out = (self.work / name for name in ("conf", "in", "out"))
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o700)
        for folder in (conf, inputs, out):
            if folder.exists():
                shutil.rmtree(folder)  # never follows the recorder's links
        _private_copy(ca_dir(), conf)
        inputs.mkdir(mode=0o750)
        os.chown(inputs, 0, RECORDER_GID)
        out.mkdir(mode=0o700)
        os.chown(out, RECORDER_UID, RECORDER_GID)
        trusted = None
        if self.trusted:
            system = Path("/etc/ssl/certs/ca-certificates.crt")
            parts = [system.read_bytes()] if system.is_file() else []
            parts += [Path(p).read_bytes() for p in self.trusted]
            _read_only_copy(b"\n".join(parts), inputs / "trusted.pem")
            trusted = INSIDE / "in" / "trusted.pem"
        archived = self.mode == "replay" and flows.is_file()
        if self.mode == "record":
            _read_only_copy(CONVERTER.read_bytes(), inputs / CONVERTER.name)
            argv = [str(exe), "-listen", f"127.0.0.1:{self.port}"]
            argv += ["-ca", str(INSIDE / "conf" / CA_KEY_AND_CERT)]
            argv += [
                "-out",
                str(INSIDE / "out" / EXCHANGES),
                "-bodies",
                str(INSIDE / "out" / BODIES),
            ]
            argv += ["-hosts", json.dumps(self.hosts)]
            argv += ["-trusted", str(trusted)] if trusted else []
            argv += ["-upstream", self.upstream] if self.upstream else []
            argv += ["-max-body-mib", str(MAX_BODY_MIB), "-max-held-mib", str(MAX_HELD_MIB)]
        else:
            _read_only_copy(ADDON.read_bytes(), inputs / ADDON.name)
            argv = [str(exe), "-q", "--listen-host", "127.0.0.1", "--listen-port", str(self.port)]
            argv += ["--set", f"confdir={INSIDE / 'conf'}", "-s", str(INSIDE / "in" / ADDON.name)]
            # HTTP/1.1 to Chromium, as the recorder speaks: mitmproxy's HTTP/2 (the
            # pure-Python h2 state machine per frame) took a third more of its CPU per request
            # (BENCHMARKS.md, issue 34); replay matches requests whatever their version
            argv += ["--set", "http2=false"]
            if archived:
                # a copy: the archive folder stays out of the recorder's reach
                _read_only_copy(flows.read_bytes(), inputs / "replay.flows")
                argv += ["--server-replay", str(INSIDE / "in" / "replay.flows")]
            # each answer once, in order, the last one kept (web_addon.py)
            argv += ["--set", "server_replay_extra=forward", "--set", "server_replay_reuse=false"]
            # forms matched by their fields, not their bytes: a multipart body's boundary is
            # new at every submission (mitmproxy parses both kinds once this list is not empty)
            argv += ["--set", f"server_replay_ignore_payload_params={NO_FORM_FIELD}"]
            # a site may have been recorded at another port (a mirror of web_hosts); the Host
            # header still names it
            argv += ["--set", "server_replay_ignore_port=true"]
            argv += ["--set", "connection_strategy=lazy", "--set", "upstream_cert=false"]
            argv += ["--set", f"legato_misses={INSIDE / 'out' / 'misses.jsonl'}"]
        enter = ["nsenter", f"--net=/proc/{netns_pid}/ns/net"] if netns_pid else []
        self._proc = subprocess.Popen(
            [*enter, *confined_argv(self.work, argv)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._pidfd = os.pidfd_open(self._proc.pid)  # our child, not reaped yet: this one
        self._pid = None
        self.task = task_id
        deadline = time.monotonic() + START_TIMEOUT_S
        while (pid := _listener(self._proc.pid, self.port)) is None:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace").strip()[-500:]
                self._proc, self.task = None, None
                self._close_pidfd()
                raise RecorderError(f"{exe.name} exited: {err or 'no message'}")
            if time.monotonic() > deadline:
                self.end()
                raise RecorderError(
                    f"{exe.name} did not listen on port {self.port} in {START_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.02)
        self._pid = pid
        return {"mode": self.mode, "task": task_id, "archived": archived}

    def _close_pidfd(self) -> None:
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is not None:
            os.close(pidfd)

    @property
    def pid(self) -> int | None:
        """The running attempt's recorder (``record``) or ``mitmdump`` (``replay``) process id
        (in the host's pid namespace), or ``None``."""
        return self._pid if self._proc is not None else None

    def misses(self) -> list[dict]:
        """The running replay attempt's requests the archive did not answer (``{"method",
        "url"}``, in order); ``[]`` when recording or none ran. Reads at most
        :data:`MISSES_MAX_BYTES`; a line that is no such object is skipped (mitmdump writes
        the file, and what it parses comes from the desktop)."""
        if self.mode != "replay" or self.task is None:
            return []
        with _open_regular(self.work / "out" / "misses.jsonl") as file:
            text = file.read(MISSES_MAX_BYTES).decode(errors="replace") if file else ""
        found = []
        for line in text.splitlines():
            try:
                miss = json.loads(line)
            except ValueError:
                continue  # a line cut at the cap, or not mitmdump's
            if isinstance(miss, dict) and {"method", "url"} <= set(miss):
                found.append({"method": str(miss["method"]), "url": str(miss["url"])})
        return found

    def end(self) -> None:
        """Stop the running attempt's recorder or ``mitmdump`` (SIGTERM: the recorder writes its
        last exchanges) and, recording, turn its exchanges into a flow file
        (:mod:`.web_exchanges`, confined) moved to ``ARCHIVE/<task>.flows`` (replacing the
        task's earlier recording; atomically). Nothing when none runs. A conversion that fails or
        an attempt with no exchange leaves the task's earlier recording (:meth:`_convert`)."""
        proc, task, pid = self._proc, self.task, self._pid
        self._proc = self._pid = None
        self._close_pidfd()
        if proc is None:
            return
        if proc.poll() is None:
            # the recorder alone: bwrap ends when it does (signalled too, bwrap would exit at
            # once and its namespace's processes die with SIGKILL, the output unfinished)
            try:
                os.kill(pid, signal.SIGTERM) if pid else os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        converted = self.mode == "record" and task is not None and self._convert()
        with _open_regular(self.work / "out" / "flows") as flows:
            if converted and flows is not None:
                target = archive_file(self.archive, task)
                self.archive.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(f".{target.name}.partial")
                with open(partial, "wb") as copy:
                    shutil.copyfileobj(flows, copy)
                os.replace(partial, target)
        for name in ("flows", EXCHANGES, BODIES):
            (self.work / "out" / name).unlink(missing_ok=True)

    def _convert(self) -> bool:
        """The attempt's exchanges turned into ``out/flows`` by :mod:`.web_exchanges` in the web
        venv's interpreter, confined as the recorder was, with no network: ``True`` when it
        wrote flows (exit 0). A failure, a timeout or an attempt with no exchange is
        ``False`` (said on standard error, the server's log, but for no exchange): the task's
        earlier recording stays."""
        out = INSIDE / "out"
        inside = [INSIDE / "in" / CONVERTER.name, out / EXCHANGES, out / BODIES, out / "flows"]
        argv = [str(web_venv() / "bin" / "python"), *map(str, inside)]
        try:
            done = subprocess.run(
                confined_argv(self.work, argv, network=False),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=CONVERT_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            print(
                f"web recorder: converting the exchanges of {self.task} timed out", file=sys.stderr
            )
            return False
        tail = done.stderr.decode(errors="replace").strip()[-500:]
        if done.returncode not in (0, NOTHING_RECORDED) or tail:
            print(
                f"web recorder: converting the exchanges: {tail or done.returncode}",
                file=sys.stderr,
            )
        return done.returncode == 0


def confined_argv(work: Path, argv: Sequence[str], *, network: bool = True) -> list[str]:
    """``bwrap`` + ``setpriv`` running ``argv`` (the recorder's, mitmdump's, the converter's)
    confined (module docstring): ``work/conf`` and ``work/in`` bound read-only at
    ``/legato/conf`` and ``/legato/in``, ``work/out`` writable at ``/legato/out``; the web venv
    and its base interpreter's prefix read-only at their own paths; the caller's network
    namespace (``network``), else a new one with nothing in it."""
    venv = Path(os.path.abspath(web_venv()))  # at the path its scripts' #! lines name
    base = Path(os.path.realpath(venv / "bin" / "python3")).parent.parent
    cmd = ["bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    cmd += [] if network else ["--unshare-net"]
    cmd += ["--die-with-parent", "--new-session", "--clearenv"]
    cmd += ["--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    cmd += ["--setenv", "LANG", "C.UTF-8", "--tmpfs", "/"]
    for top in READ_ONLY:
        if os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    for top in TOP_LINKS:
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    made: set[str] = set()
    for path in (venv, base):
        if any(path.is_relative_to(top) for top in READ_ONLY):
            continue
        for parent in reversed(path.parents[:-1]):  # /root, /root/.cache, ...: 0755, empty
            if str(parent) not in made:
                made.add(str(parent))
                cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind", os.path.realpath(path), str(path)]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--perms", "1777", "--tmpfs", "/tmp", "--perms", "0755", "--dir", str(INSIDE)]
    cmd += ["--ro-bind", str(work / "conf"), str(INSIDE / "conf")]
    cmd += ["--ro-bind", str(work / "in"), str(INSIDE / "in")]
    cmd += ["--bind", str(work / "out"), str(INSIDE / "out"), "--remount-ro", "/"]
    cmd += ["setpriv", f"--reuid={RECORDER_UID}", f"--regid={RECORDER_GID}", "--clear-groups"]
    cmd += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--", *argv]
    return cmd


def _private_copy(source: Path, target: Path) -> None:
    """The CA folder's files copied into ``target`` (root's, readable by the recorder's
    group, not writable by it: mitmproxy reads the key to sign the sites' certificates)."""
    target.mkdir(mode=0o750)
    os.chown(target, 0, RECORDER_GID)
    for file in source.iterdir():
        if file.is_file():
            _read_only_copy(file.read_bytes(), target / file.name)


def _read_only_copy(data: bytes, target: Path) -> None:
    """``data`` written to ``target``, root's, mode 0440, group :data:`RECORDER_GID`."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o440)
    with os.fdopen(fd, "wb") as file:
        os.fchown(fd, 0, RECORDER_GID)
        file.write(data)


@contextmanager
def _open_regular(path: Path) -> Iterator[BinaryIO | None]:
    """``path`` opened for reading (binary) when it is a regular file, else ``None``: not a
    link, fifo or device (the recorder names what is in its ``out`` folder; the server is
    root)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        yield None
        return
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        yield None
        return
    with os.fdopen(fd, "rb") as file:
        yield file


def _listener(pid: int, port: int) -> int | None:
    """The process among ``pid`` and its descendants (``bwrap``'s init, ``mitmdump``)
    listening on TCP ``port`` (IPv4), or ``None``."""
    todo = [pid]
    while todo:
        current = todo.pop()
        if port in _listening(current):
            return current
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                todo += map(int, Path(f"/proc/{current}/task/{task}/children").read_text().split())
        except OSError:
            continue
    return None


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
