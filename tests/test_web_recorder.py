"""The web recorder on its own (``desktops/server/recorder.py``: ``legato-web-recorder``
recording, mitmproxy's mitmdump replaying, on this host's network, no desktop), driven by curl
as a browser would use a proxy: recording goes through the configured upstream proxy (desktop
option ``proxy``), replay answers from the archive with the site stopped and lists what the
archive lacks."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from legato_pipelines.desktops.server.recorder import (
    CA_CERT,
    RECORDER_UID,
    WebRecorder,
    ca_dir,
    mitmdump,
    web_recorder,
    web_venv,
)
from tests.web_standin import (
    NAME,
    STREAM_GAP_S,
    TITLE,
    StandIn,
    make_ca,
    serve_standin,
    serve_standin_h2,
)

pytestmark = [
    pytest.mark.skipif(
        mitmdump() is None or web_recorder() is None,
        reason="needs the web venv (scripts/web_venv.sh)",
    ),
    pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl"),
]


class ConnectProxy:
    """A stand-in upstream proxy: answers ``CONNECT name:port`` by connecting to
    ``targets[name]`` and relaying bytes both ways; ``asked`` lists the CONNECT lines."""

    def __init__(self, targets: dict[str, tuple[str, int]]):
        self.targets, self.asked = targets, []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(conn,), daemon=True).start()

    def _tunnel(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
        line = head.split(b"\r\n")[0].decode()
        self.asked.append(line)
        name = line.split()[1].rsplit(":", 1)[0]
        upstream = socket.create_connection(self.targets[name])
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")

        def pipe(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                b.close()

        threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()
        pipe(conn, upstream)

    def close(self) -> None:
        self.sock.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(port: int, path: str) -> tuple[str, str]:
    """(status, body) of ``https://NAME{path}`` through the proxy on ``port``, trusting the
    recorder's CA as the desktops' Chromium does."""
    done = subprocess.run(
        ["curl", "-s", "-w", "\n%{http_code}", "--proxy", f"http://127.0.0.1:{port}",
         "--cacert", str(ca_dir() / CA_CERT), f"https://{NAME}{path}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    body, _, status = done.stdout.rpartition("\n")
    return status, body


def _process(pid: int, name: str = "mitmdump") -> int:
    """The process among ``pid`` and its descendants whose command line names ``name``
    (``mitmdump``, ``legato-web-recorder``): what bwrap and setpriv run."""
    todo = [pid]
    while todo:
        current = todo.pop()
        argv = Path(f"/proc/{current}/cmdline").read_bytes().decode().split("\0")
        if any(Path(arg).name == name for arg in argv[:2]):  # the program, or python's script
            return current
        for task in os.listdir(f"/proc/{current}/task"):
            todo += map(int, Path(f"/proc/{current}/task/{task}/children").read_text().split())
    raise AssertionError(f"no {name} under process {pid}")


def _assert_confined(pid: int, tmp_path: Path) -> None:
    """The recorder's process ``pid``: the recorder's uid, no capability, no_new_privs, mount
    and pid namespaces of its own, and, acting as it (its uid, groups, capabilities, mount
    namespace), it writes none of the host's root-owned files and reads not the CA key."""
    status = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    assert status["Uid"].split() == [str(RECORDER_UID)] * 4
    assert status["Gid"].split() == [str(RECORDER_UID)] * 4
    assert status["Groups"].strip() == ""
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert status[caps] == "0000000000000000", caps
    assert status["NoNewPrivs"] == "1"
    for ns in ("mnt", "pid", "ipc", "uts"):
        assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
    assert os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")
    # what it sees of the host: root's home holds only the venv's path, no CA folder, no tests
    root = Path(f"/proc/{pid}/root")
    assert not (root / str(ca_dir()).lstrip("/")).exists()
    assert not (root / str(tmp_path).lstrip("/")).exists()
    assert not (root / "run").exists() and not (root / "home").exists()
    # acting as it: writes to host root-owned places (its venv, visible; a root-owned folder
    # of the host's, 0755, not visible) and reads of the CA key all fail
    host_dir = tmp_path / "root-owned"
    host_dir.mkdir(exist_ok=True)
    os.chmod(host_dir, 0o755)
    uid, gid = status["Uid"].split()[0], status["Gid"].split()[0]
    as_it = ["nsenter", f"--target={pid}", "--mount", "--", "setpriv", f"--reuid={uid}"]
    as_it += [f"--regid={gid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    as_it += ["--no-new-privs", "--", "sh", "-c"]
    targets = [web_venv() / "legato-probe", host_dir / "probe", Path("/etc/legato-probe")]
    try:
        for target in targets:
            subprocess.run([*as_it, f"echo x > {target}"], capture_output=True, timeout=30)
            assert not target.exists(), f"the recorder wrote {target}"
        key = ca_dir() / "mitmproxy-ca.pem"
        done = subprocess.run([*as_it, f"cat {key}"], capture_output=True, timeout=30)
        assert done.returncode != 0 and b"PRIVATE KEY" not in done.stdout
    finally:
        for target in targets:
            target.unlink(missing_ok=True)


def test_recorded_through_the_upstream_proxy_then_replayed_without_the_site(tmp_path):
    ca, cert, key = make_ca(tmp_path / "ca")
    archive = tmp_path / "archive"
    with serve_standin(cert, key) as site:
        upstream = ConnectProxy({NAME: ("127.0.0.1", site.port)})
        recorder = WebRecorder(
            "record",
            archive,
            tmp_path / "work",
            _free_port(),
            upstream=f"http://127.0.0.1:{upstream.port}",
            trusted=[ca],
        )
        try:
            assert recorder.begin("shop", None) == {
                "mode": "record",
                "task": "shop",
                "archived": False,
            }
            # the recorder parses what the desktop sends: confined (docs/sandbox.md §4)
            _assert_confined(_process(recorder._proc.pid, "legato-web-recorder"), tmp_path)
            status, body = _get(recorder.port, "/page")
            assert status == "200" and f"<title>{TITLE}</title>" in body
            recorder.end()  # the attempt's flows become the task's archive file
        finally:
            recorder.end()
            upstream.close()
        assert upstream.asked == [f"CONNECT {NAME}:443 HTTP/1.1"]  # the proxy setting
        assert site.requests == ["/page"]
    assert (archive / "shop.flows").stat().st_size > 0
    # the site is gone: the replay answers from the archive and lists what it lacks
    replay = WebRecorder("replay", archive, tmp_path / "work2", _free_port())
    try:
        assert replay.begin("shop", None)["archived"] is True
        # mitmdump parses what the desktop sends: confined (docs/sandbox.md §4)
        _assert_confined(_process(replay._proc.pid), tmp_path)
        status, body = _get(replay.port, "/page")
        assert status == "200" and f"<title>{TITLE}</title>" in body
        assert _get(replay.port, "/fresh?1")[0] == "404"
        assert replay.misses() == [{"method": "GET", "url": f"https://{NAME}/fresh?1"}]
        # a task with no recording: every request is a miss, none leaves the host
        replay.begin("other", None)
        assert _get(replay.port, "/page")[0] == "404"
        assert replay.misses() == [{"method": "GET", "url": f"https://{NAME}/page"}]
    finally:
        replay.end()


def _output(pid: int, option: str) -> Path:
    """Where the recorder's process ``pid`` writes the file of its command line's ``option``
    (``-out`` or ``legato_misses=``), seen from the host through its own root."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    inside = next(
        argv[i + 1] if arg == option else arg.split("=", 1)[1]
        for i, arg in enumerate(argv)
        if arg == option or arg.startswith(option)
    )
    return Path(f"/proc/{pid}/root") / inside.lstrip("/")


def test_the_server_follows_no_link_the_recorder_plants(tmp_path):
    """A compromised recorder replaces its outputs by links to host files: the server (root)
    reads none of them into the misses or the archive."""
    secret = tmp_path / "secret"
    secret.write_text('{"method": "SECRET", "url": "root-only"}\n')
    os.chmod(secret, 0o600)
    archive = tmp_path / "archive"
    recorder = WebRecorder("record", archive, tmp_path / "work", _free_port())
    try:
        recorder.begin("shop", None)
        recorded = _process(recorder._proc.pid, "legato-web-recorder")
        exchanges = _output(recorded, "-out")
        flows = exchanges.with_name("flows")  # what the conversion writes and the server reads
        for planted in (exchanges, flows):
            planted.unlink(missing_ok=True)
            planted.symlink_to(secret)
        recorder.end()
    finally:
        recorder.end()
    saved = archive / "shop.flows"
    assert not saved.exists() or b"SECRET" not in saved.read_bytes()
    replay = WebRecorder("replay", archive, tmp_path / "work2", _free_port())
    try:
        replay.begin("other", None)
        misses = _output(_process(replay._proc.pid), "legato_misses=")
        misses.unlink(missing_ok=True)
        misses.symlink_to(secret)
        assert replay.misses() == []
    finally:
        replay.end()


def _flow_paths(flows: Path) -> list[str]:
    """The request paths of the flows in the flow file ``flows``, read by mitmproxy's own
    ``FlowReader`` (what ``--server-replay`` reads), in the web venv's interpreter."""
    code = (
        "import sys; from mitmproxy import io\n"
        "with open(sys.argv[1], 'rb') as f:\n"
        "    print('\\n'.join(fl.request.path for fl in io.FlowReader(f).stream()))"
    )
    done = subprocess.run(
        [str(web_venv() / "bin" / "python"), "-c", code, str(flows)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return done.stdout.split()


@contextlib.contextmanager
def _recorded(tmp_path: Path, task: str) -> Iterator[tuple[WebRecorder, StandIn]]:
    """``(recorder, site)``: the stand-in site and a recorder into ``tmp_path/archive`` that
    reaches it, attempt ``task`` begun; on exit the attempt ends (its archive file written),
    then the site stops (``site.requests`` stays readable)."""
    ca, cert, key = make_ca(tmp_path / "ca")
    with serve_standin(cert, key) as site:
        recorder = _recording(tmp_path, tmp_path / "archive", site, ca)
        try:
            recorder.begin(task, None)
            yield recorder, site
        finally:
            recorder.end()


@contextlib.contextmanager
def _replaying(tmp_path: Path, task: str) -> Iterator[WebRecorder]:
    """A replay of ``tmp_path/archive`` (no site), attempt ``task`` begun; ended on exit."""
    replay = WebRecorder("replay", tmp_path / "archive", tmp_path / "work2", _free_port())
    try:
        replay.begin(task, None)
        yield replay
    finally:
        replay.end()


def test_every_exchange_is_archived_in_order_and_replayed(tmp_path):
    """The attempt's exchanges, written by the recorder as they finish and turned into a flow
    file at the attempt's end (SIGTERM), are all in the archive, in order, read by
    mitmproxy's own reader, and the replay answers each with no miss."""
    paths = ["/page", "/style.css", *(f"/fresh?{i}" for i in range(30))]
    with _recorded(tmp_path, "gallery") as (recorder, site):
        for path in paths:
            assert _get(recorder.port, path)[0] == "200"
    assert site.requests == paths
    assert _flow_paths(tmp_path / "archive" / "gallery.flows") == paths
    assert not (tmp_path / "work" / "out" / "exchanges.jsonl").exists()
    with _replaying(tmp_path, "gallery") as replay:
        assert [_get(replay.port, p)[0] for p in paths] == ["200"] * len(paths)
        assert replay.misses() == []


def _post(port: int, data: bytes, tmp_path: Path) -> tuple[str, bytes, str]:
    """(status, body as received, content-encoding) of ``POST https://NAME/echo`` with
    ``data`` through the proxy on ``port``; curl asks for gzip and does not decode it."""
    body = tmp_path / "answer"
    done = subprocess.run(
        ["curl", "-s", "-o", str(body), "-w", "%{http_code} %header{content-encoding}",
         "--proxy", f"http://127.0.0.1:{port}", "--cacert", str(ca_dir() / CA_CERT),
         "-H", "Accept-Encoding: gzip", "-H", "Content-Type: application/octet-stream",
         "--data-binary", "@-", f"https://{NAME}/echo"],
        input=data, capture_output=True, timeout=60,
    )  # fmt: skip
    status, _, encoding = done.stdout.decode().partition(" ")
    return status, body.read_bytes(), encoding


def test_a_post_and_a_compressed_answer_replay_byte_for_byte(tmp_path):
    """Bodies are recorded as they crossed the wire: a binary POST body (matched by the replay:
    another body is a miss) and a gzip answer replayed with the same bytes and encoding, not
    decoded and not compressed twice."""
    data = bytes(range(256)) * 3
    with _recorded(tmp_path, "form") as (recorder, site):
        live = _post(recorder.port, data, tmp_path)
    assert site.requests == ["POST /echo"]
    status, body, encoding = live
    assert (status, encoding) == ("200", "gzip")
    assert gzip.decompress(body).endswith(b"\n" + data)
    with _replaying(tmp_path, "form") as replay:
        assert _post(replay.port, data, tmp_path) == live
        assert replay.misses() == []
        assert _post(replay.port, b"another body", tmp_path)[0] == "404"
        assert replay.misses() == [{"method": "POST", "url": f"https://{NAME}/echo"}]


def test_a_body_beyond_the_cap_is_not_held(tmp_path, monkeypatch):
    """A page cannot grow the host's recorder without bound (``MAX_BODY_MIB``): a request body
    beyond it is answered 502 (read whole before it is sent); a response beyond it reaches the
    browser whole but is not recorded, so the replay lists it as a miss; bodies within are
    recorded."""
    monkeypatch.setattr("legato_pipelines.desktops.server.recorder.MAX_BODY_MIB", 1)
    with _recorded(tmp_path, "big") as (recorder, site):
        assert _post(recorder.port, b"x" * (2 << 20), tmp_path)[0] == "502"
        assert _post(recorder.port, b"y" * (512 << 10), tmp_path)[0] == "200"
        status, body = _fetch(recorder.port, "/big?2048", tmp_path)
        assert status == "200" and len(body) == 2 << 20
    assert site.requests == ["POST /echo", "/big?2048"]  # the big post never reached it
    assert _flow_paths(tmp_path / "archive" / "big.flows") == ["/echo"]
    with _replaying(tmp_path, "big") as replay:
        assert _fetch(replay.port, "/big?2048", tmp_path)[0] == "404"
        assert replay.misses() == [{"method": "GET", "url": f"https://{NAME}/big?2048"}]
    # within the cap, beyond what all answers in flight may hold together (MAX_HELD_MIB)
    monkeypatch.setattr("legato_pipelines.desktops.server.recorder.MAX_BODY_MIB", 8)
    monkeypatch.setattr("legato_pipelines.desktops.server.recorder.MAX_HELD_MIB", 1)
    with _recorded(tmp_path, "held") as (recorder, _):
        status, body = _fetch(recorder.port, "/big?2048", tmp_path)
        assert status == "200" and len(body) == 2 << 20
        assert _fetch(recorder.port, "/big?512", tmp_path)[0] == "200"
    assert _flow_paths(tmp_path / "archive" / "held.flows") == ["/big?512"]


def test_a_failed_or_empty_conversion_keeps_the_earlier_recording(tmp_path, monkeypatch):
    """The task's archive file is replaced only by a conversion that wrote flows: an attempt
    with no exchange, or a conversion that fails halfway (a partial flow file, exit 1), leaves
    the earlier recording whole, so a replay never takes a broken file for a recording."""
    with _recorded(tmp_path, "t") as (recorder, _):
        for path in ("/page", "/style.css"):
            assert _get(recorder.port, path)[0] == "200"
    saved = tmp_path / "archive" / "t.flows"
    before = saved.read_bytes()
    with _recorded(tmp_path, "t"):
        pass  # no request
    assert saved.read_bytes() == before
    failing = tmp_path / "failing_converter.py"
    failing.write_text("import sys\nopen(sys.argv[-1], 'wb').write(b'12:partial')\nsys.exit(1)\n")
    monkeypatch.setattr("legato_pipelines.desktops.server.recorder.CONVERTER", failing)
    with _recorded(tmp_path, "t") as (recorder, _):
        assert _get(recorder.port, "/page")[0] == "200"
    assert saved.read_bytes() == before
    assert _flow_paths(saved) == ["/page", "/style.css"]


def _fetch(
    port: int, path: str, tmp_path: Path, *curl: str, write_out: str = ""
) -> tuple[str, bytes]:
    """(status and curl's ``write_out``, body) of ``https://NAME{path}`` through the proxy on
    ``port``, the path sent as it is (``--path-as-is``; no escaping by curl)."""
    body = tmp_path / "fetched"
    done = subprocess.run(
        ["curl", "-s", "-g", "--path-as-is", "-o", str(body), "-w", "%{http_code}" + write_out, "--proxy",
         f"http://127.0.0.1:{port}", "--cacert", str(ca_dir() / CA_CERT), *curl,
         f"https://{NAME}{path}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.stdout, body.read_bytes() if body.exists() else b""


def test_what_the_site_said_is_what_the_browser_gets_and_the_replay_gives(tmp_path):
    """Fidelity, recording then replaying with the site stopped: a path with ``|^{}`` reaches
    the site and the archive as sent (Go would escape it again); an answer without a
    Content-Type gets none added; an answer that changed (``/count``) replays in the recorded
    order, then its last answer again; a multipart form, whose boundary changes at every
    submission, matches by its fields (another value is a miss)."""
    odd, form, kind = "/p|a^t{h}?q=1", ("-F", "field=value"), " %header{content-type}"
    with _recorded(tmp_path, "fidelity") as (recorder, site):
        assert _fetch(recorder.port, odd, tmp_path) == ("404", b"no")
        assert _fetch(recorder.port, "/bare", tmp_path, write_out=kind) == ("200 ", b"\xe9t\xe9")
        counted = [_fetch(recorder.port, "/count", tmp_path)[1] for _ in range(2)]
        assert counted == [b"answer 1", b"answer 2"]
        posted = _fetch(recorder.port, "/echo", tmp_path, *form)
        assert posted[0] == "200"
    assert site.requests == [odd, "/bare", "/count", "/count", "POST /echo"]
    with _replaying(tmp_path, "fidelity") as replay:
        assert _fetch(replay.port, odd, tmp_path) == ("404", b"no")  # the site's, not a miss
        assert _fetch(replay.port, "/bare", tmp_path, write_out=kind)[0] == "200 "
        counted = [_fetch(replay.port, "/count", tmp_path)[1] for _ in range(3)]
        assert counted == [b"answer 1", b"answer 2", b"answer 2"]
        assert _fetch(replay.port, "/echo", tmp_path, *form) == posted  # a new boundary
        assert replay.misses() == []
        assert _fetch(replay.port, "/echo", tmp_path, "-F", "field=other")[0] == "404"
        assert replay.misses() == [{"method": "POST", "url": f"https://{NAME}/echo"}]


class _PathEcho(http.server.BaseHTTPRequestHandler):
    """A plain-HTTP site answering each GET with the request target it got."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_plain_http_path_is_sent_as_written(tmp_path):
    """A plain-HTTP site (no tunnel: the browser asks the proxy in absolute form) gets an odd
    path as the browser wrote it, and the replay answers it from the archive."""
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PathEcho)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{site.server_address[1]}/p|a^t{{h}}?q=1"

    def fetch(port: int) -> str:
        argv = ["curl", "-s", "-g", "--path-as-is", "--proxy", f"http://127.0.0.1:{port}", url]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout

    recorder = WebRecorder("record", tmp_path / "archive", tmp_path / "work", _free_port())
    try:
        recorder.begin("plain", None)
        assert fetch(recorder.port) == "/p|a^t{h}?q=1"
    finally:
        recorder.end()
        site.shutdown()
        site.server_close()
    with _replaying(tmp_path, "plain") as replay:
        assert fetch(replay.port) == "/p|a^t{h}?q=1"
        assert replay.misses() == []


def test_an_answer_is_passed_on_as_it_arrives(tmp_path):
    """A streamed answer (an event stream, a long poll: ``/stream``, its last chunk
    ``STREAM_GAP_S`` after its first) reaches the browser chunk by chunk through the recorder,
    not when it ends, and is recorded whole."""
    times = " %{time_starttransfer} %{time_total}"
    with _recorded(tmp_path, "stream") as (recorder, _):
        status, body = _fetch(recorder.port, "/stream", tmp_path, write_out=times)
    code, first, total = status.split()
    assert code == "200" and body == b"first\nlast\n"
    assert float(first) < STREAM_GAP_S - 1 and float(total) >= STREAM_GAP_S  # chunk by chunk
    with _replaying(tmp_path, "stream") as replay:
        assert _fetch(replay.port, "/stream", tmp_path) == ("200", b"first\nlast\n")


def test_the_replay_relays_no_tunnel_and_reads_only_well_formed_misses(tmp_path):
    """Replaying connects to nothing: a tunnel carrying no HTTP is closed before any byte
    reaches its target, and listed as a miss. The misses file is mitmdump's (it parses what
    the desktop sends): a line that is not a miss is skipped, not raised."""
    target = socket.create_server(("127.0.0.1", 0))
    target.settimeout(2)
    port = target.getsockname()[1]
    replay = WebRecorder("replay", tmp_path / "archive", tmp_path / "work", _free_port())
    try:
        replay.begin("none", None)
        with socket.create_connection(("127.0.0.1", replay.port), timeout=10) as conn:
            conn.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            assert conn.recv(100).startswith(b"HTTP/1.1 200")
            conn.sendall(b"SSH-2.0-hello\r\n")
            with pytest.raises(OSError):  # nothing connects (timeout)
                target.accept()
        misses = _output(_process(replay._proc.pid), "legato_misses=")
        assert replay.misses() == [{"method": "CONNECT", "url": f"tcp://127.0.0.1:{port}"}]
        with open(misses, "a") as out:
            out.write('not json\n{"url": "no method"}\n[1]\n')
        assert len(replay.misses()) == 1
    finally:
        replay.end()
        target.close()


def _recording(tmp_path: Path, archive: Path, site, ca: Path) -> WebRecorder:
    """A recorder into ``archive`` (work folder ``tmp_path/work``) that reaches the stand-in
    ``site`` under :data:`NAME` and trusts the test CA ``ca``."""
    hosts = {NAME: f"127.0.0.1:{site.port}"}
    return WebRecorder(
        "record", archive, tmp_path / "work", _free_port(), hosts=hosts, trusted=[ca]
    )


def _version(port: int, path: str) -> str:
    """The HTTP version curl spoke through the proxy on ``port`` for ``https://NAME{path}``,
    offering HTTP/2 (ALPN ``h2``, as Chromium does)."""
    done = subprocess.run(
        ["curl", "-s", "--fail", "--http2", "-o", "/dev/null", "-w", "%{http_version}",
         "--proxy", f"http://127.0.0.1:{port}", "--cacert", str(ca_dir() / CA_CERT),
         f"https://{NAME}{path}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


def test_the_recorder_speaks_http2_where_browser_and_site_do(tmp_path):
    """Recording keeps the protocol of the live page (a browser limited to HTTP/1.1 opens six
    connections a site and loads a page's images in rounds): a client and a site that both
    offer HTTP/2 speak it through the recorder, each to it; a site of HTTP/1.1 only gets
    HTTP/1.1. The replay speaks HTTP/1.1 (``http2=false``: mitmproxy's HTTP/2 cost a third
    more CPU per request) and answers what was recorded over HTTP/2."""
    ca, cert, key = make_ca(tmp_path / "ca")
    archive = tmp_path / "archive"
    with serve_standin_h2(cert, key) as site:
        recorder = _recording(tmp_path, archive, site, ca)
        try:
            recorder.begin("h2", None)
            assert _version(recorder.port, "/page") == "2"
        finally:
            recorder.end()
        assert site.versions == ["HTTP/2.0"] and site.requests == ["/page"]
    with serve_standin(cert, key) as site:  # HTTP/1.1 only
        recorder = _recording(tmp_path, archive, site, ca)
        try:
            recorder.begin("h1", None)
            assert _version(recorder.port, "/style.css") == "2"  # the browser's side
        finally:
            recorder.end()
        assert site.requests == ["/style.css"]
    assert _flow_paths(archive / "h2.flows") == ["/page"]
    replay = WebRecorder("replay", archive, tmp_path / "work2", _free_port())
    try:
        replay.begin("h2", None)
        assert _version(replay.port, "/page") == "1.1"
        assert replay.misses() == []
    finally:
        replay.end()
