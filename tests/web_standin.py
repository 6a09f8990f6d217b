"""A stand-in website for the web tests (issue 34): HTTPS on this host's loopback with a
certificate of a local CA made here, for names that exist nowhere else (``*.standin.test``:
mapped by desktop option ``web_hosts``).

Its page ``/page`` has the title :data:`TITLE`, loads ``/style.css`` and, from a script,
``/fresh?<random>``: a request no archive can hold, so every replay misses it once."""

from __future__ import annotations

import contextlib
import datetime
import gzip
import hashlib
import http.server
import os
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

NAME = "www.standin.test"
#: ``/stream``: seconds between its first and its last chunk.
STREAM_GAP_S = 3.0
TITLE = "Stand-in shop"
#: ``/gallery?N``: a page of 24 images (each its own request), for the recorder's benchmark.
GALLERY = "<html><head><title>Gallery</title></head><body>{}</body></html>"
#: A 1x1 PNG.
PIXEL = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cf00000301010018dd8db40000000049454e44ae426082"
)
PAGE = f"""<html><head><title>{TITLE}</title><link rel="stylesheet" href="/style.css"></head>
<body><h1>{TITLE}</h1><script>fetch("/fresh?" + Math.random())</script></body></html>"""


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def make_ca(folder: Path, names: tuple[str, ...] = (NAME,)) -> tuple[Path, Path, Path]:
    """``(ca.pem, site.pem, site.key)`` in ``folder``: a CA and a certificate it signed for
    ``names``."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, site_key = _key(), _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "legato test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    site = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(site_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    paths = (folder / "ca.pem", folder / "site.pem", folder / "site.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(site.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_pem(site_key))
    return paths


def answer(target: str) -> tuple[int, dict[str, str], bytes]:
    """The stand-in's answer to ``GET target`` (path and query): ``(status, headers, body)``."""
    path, _, query = target.partition("?")
    images = "".join(f'<img src="/img/{query}-{i}.png">' for i in range(24))
    body, kind = {
        "/page": (PAGE.encode(), "text/html"),
        "/style.css": (b"h1 { color: #a33; }", "text/css"),
        "/fresh": (b"{}", "application/json"),
        "/gallery": (GALLERY.format(images).encode(), "text/html"),
    }.get(path, (PIXEL, "image/png") if path.startswith("/img/") else (b"no", "text/plain"))
    if path == "/big":  # /big?KIB: that many KiB
        body, kind = bytes(range(256)) * 4 * int(query or 1), "application/octet-stream"
    found = path in ("/page", "/style.css", "/fresh", "/gallery", "/big", "/bare")
    found = found or path.startswith("/img/")
    headers = {"Content-Type": kind, "Content-Length": str(len(body))}
    if path == "/bare":  # no Content-Type at all
        body, headers = b"\xe9t\xe9", {"Content-Length": "3"}
    if path == "/gallery" or path.startswith("/img/"):  # every reload fetches again
        headers["Cache-Control"] = "no-store"
    return (200 if found else 404), headers, body


@dataclass
class StandIn:
    """A running stand-in: ``port`` on ``127.0.0.1``, ``requests`` the paths served."""

    port: int
    requests: list[str] = field(default_factory=list)
    server: http.server.ThreadingHTTPServer | None = None
    counted: int = 0

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@contextlib.contextmanager
def serve_standin(site_cert: Path, site_key: Path, host: str = "127.0.0.1") -> Iterator[StandIn]:
    """Serve the stand-in over HTTPS on ``host`` (a free port); stopped on exit (or before,
    with :meth:`StandIn.stop`)."""
    standin = StandIn(port=0)

    class Site(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30  # an idle keep-alive connection ends its thread
        # TCP_NODELAY, as web servers set it: the body, written after the headers, is sent
        # at once, not 40 ms later (Nagle's algorithm waiting for the client's delayed ACK)
        disable_nagle_algorithm = True

        def setup(self):
            # the TLS handshake in this connection's thread: done in accept(), one client that
            # connects and waits (Chromium's preconnects) stalled every other one
            self.request.settimeout(self.timeout)
            self.request.do_handshake()
            super().setup()

        def do_GET(self):  # noqa: N802 (http.server's name)
            standin.requests.append(self.path)
            if self.path == "/stream":
                return self._stream()
            if self.path == "/count":  # a page whose answer changes: "answer 1", "answer 2"...
                standin.counted += 1
                body = f"answer {standin.counted}".encode()
                status, headers = (
                    200,
                    {"Content-Type": "text/plain", "Content-Length": str(len(body))},
                )
            else:
                status, headers, body = answer(self.path)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def _stream(self):
            """``/stream``: a chunked answer, a first chunk at once and the last
            :data:`STREAM_GAP_S` later (an event stream, a long poll)."""
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i, chunk in enumerate((b"first\n", b"last\n")):
                if i:
                    time.sleep(STREAM_GAP_S)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

        def do_POST(self):  # noqa: N802 (http.server's name)
            """``POST /echo``: the body's sha256 and the body, gzip-compressed (a form post
            and an encoded answer, as real sites send)."""
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            standin.requests.append(f"POST {self.path}")
            body = gzip.compress(hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
            self.send_response(200)
            for name, value in (
                ("Content-Type", "application/octet-stream"),
                ("Content-Encoding", "gzip"),
                ("Content-Length", str(len(body))),
            ):
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((host, 0), Site)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(site_cert, site_key)
    server.socket = context.wrap_socket(
        server.socket, server_side=True, do_handshake_on_connect=False
    )
    standin.server, standin.port = server, server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield standin
    finally:
        standin.stop()


@dataclass
class StandInH2:
    """A running HTTP/2 stand-in (:func:`serve_standin_h2`): ``port`` on its host; ``log``
    the file of its requests (``HTTP/2.0 /path`` lines)."""

    port: int
    log: Path

    @property
    def requests(self) -> list[str]:
        """The paths served, in order."""
        return [line.split(" ", 1)[1] for line in self.log.read_text().splitlines()]

    @property
    def versions(self) -> list[str]:
        """The HTTP versions of the requests served, in order."""
        return [line.split(" ", 1)[0] for line in self.log.read_text().splitlines()]


@contextlib.contextmanager
def serve_standin_h2(
    site_cert: Path, site_key: Path, host: str = "127.0.0.1"
) -> Iterator[StandInH2]:
    """Serve the stand-in over HTTPS on ``host`` (a free port) with mitmproxy's ``mitmdump``
    from the web venv (``tests/web_standin_h2.py``: HTTP/2 to clients that offer it); stopped
    on exit. Raises ``RuntimeError`` when the web venv is missing or it does not listen."""
    from legato_pipelines.desktops.server.recorder import mitmdump

    exe = mitmdump()
    if exe is None:
        raise RuntimeError("the HTTP/2 stand-in needs the web venv (scripts/web_venv.sh)")
    folder = Path(tempfile.mkdtemp(prefix="standin-h2-"))
    (folder / "site.pem").write_bytes(site_key.read_bytes() + site_cert.read_bytes())
    log = folder / "requests"
    log.touch()
    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    argv = [str(exe), "-q", "--mode", "reverse:https://127.0.0.1:9", "--listen-host", host]
    argv += ["--listen-port", str(port), "--set", f"certs=*={folder / 'site.pem'}"]
    argv += ["--set", "connection_strategy=lazy", "--set", "upstream_cert=false"]
    argv += ["--set", f"confdir={folder / 'conf'}", "--set", f"standin_log={log}"]
    argv += ["-s", str(Path(__file__).with_name("web_standin_h2.py"))]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the HTTP/2 stand-in did not listen") from None
                time.sleep(0.1)
        yield StandInH2(port, log)
    finally:
        proc.terminate()
        proc.wait(30)
