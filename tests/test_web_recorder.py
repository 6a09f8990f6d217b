"""The web recorder on its own (``desktops/server/recorder.py``: mitmproxy's mitmdump on this
host's network, no desktop), driven by curl as a browser would use a proxy: recording goes
through the configured upstream proxy (desktop option ``proxy``), replay answers from the
archive with the site stopped and lists what the archive lacks."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading

import pytest

from legato_pipelines.desktops.server.recorder import CA_CERT, WebRecorder, ca_dir, mitmdump
from tests.web_standin import NAME, TITLE, make_ca, serve_standin

pytestmark = [
    pytest.mark.skipif(mitmdump() is None, reason="needs the web venv (scripts/web_venv.sh)"),
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
        # mitmdump parses what the desktop sends: root without any capability
        status = dict(
            line.split(":\t", 1)
            for line in open(f"/proc/{replay._proc.pid}/status").read().splitlines()
        )
        assert status["CapEff"] == status["CapBnd"] == "0000000000000000"
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
