"""The web recorder's exchanges turned into mitmproxy's flow file (:mod:`.recorder`, issue 34):
run at the attempt's end, confined as the recorder is, by the web venv's interpreter (so it
imports mitmproxy and the standard library only, never the project)::

    python web_exchanges.py EXCHANGES BODIES FLOWS

``EXCHANGES``: what ``legato-web-recorder`` (``web_recorder/main.go``) wrote, one JSON object
a line: ``start``/``end`` (seconds since the epoch), ``method``, ``scheme``, ``host``,
``port``, ``path`` (with the query), ``http_version``, ``request_headers`` and
``response_headers`` (``[[name, value], ...]``), ``request_body`` and ``response_body``
(``[offset, length]`` in ``BODIES``, which holds the bytes as they crossed the wire:
compressed bodies stay compressed, as their ``content-encoding`` says), ``status``,
``reason``, ``response_version``. ``FLOWS``: the same
exchanges as HTTP flows in mitmproxy's flow file format (``io.FlowWriter``: what ``mitmdump
-w`` writes and ``--server-replay`` reads), in the order they finished. A line that is not
such an object is skipped and counted on standard error (a recorder killed mid-line). Exits 0
when it wrote flows, :data:`NOTHING` (3) when it wrote none, 1 on an error: only a 0 replaces
the task's archive file (``recorder.WebRecorder.end``).
"""

from __future__ import annotations

import json
import sys


def _headers(pairs):
    from mitmproxy import http

    return http.Headers([(str(k).encode(), str(v).encode()) for k, v in pairs])


def _body(bodies, where) -> bytes:
    """The bytes at ``where`` (``[offset, length]``) of the open file ``bodies``."""
    offset, length = (int(x) for x in where or (0, 0))
    if length <= 0:
        return b""
    bodies.seek(offset)
    data = bodies.read(length)
    if len(data) != length:
        raise ValueError(f"bodies file ends before {offset}+{length}")
    return data


def to_flow(exchange: dict, bodies):
    """One exchange (module docstring) as a mitmproxy ``HTTPFlow`` with its response; its
    bodies read from the open file ``bodies``."""
    from mitmproxy import connection, http

    start, end = float(exchange["start"]), float(exchange["end"])
    host, port = str(exchange["host"]), int(exchange["port"])
    client = connection.Client(
        peername=("127.0.0.1", 0), sockname=("127.0.0.1", 0), timestamp_start=start
    )
    flow = http.HTTPFlow(client, connection.Server(address=(host, port)))
    flow.request = http.Request(
        host,
        port,
        str(exchange["method"]).encode(),
        str(exchange["scheme"]).encode(),
        b"",
        str(exchange["path"]).encode(),
        str(exchange.get("http_version") or "HTTP/1.1").encode(),
        _headers(exchange.get("request_headers") or []),
        _body(bodies, exchange.get("request_body")),
        None,
        start,
        start,
    )
    flow.response = http.Response(
        str(exchange.get("response_version") or "HTTP/1.1").encode(),
        int(exchange["status"]),
        str(exchange.get("reason") or "").encode(),
        _headers(exchange.get("response_headers") or []),
        _body(bodies, exchange.get("response_body")),
        None,
        start,
        end,
    )
    return flow


def convert(exchanges_path: str, bodies_path: str, flows_path: str) -> tuple[int, int]:
    """``exchanges_path`` (bodies in ``bodies_path``) written as flows to ``flows_path``:
    ``(written, skipped)``."""
    from mitmproxy import io

    written = skipped = 0
    with (
        open(exchanges_path, "rb") as source,
        open(bodies_path, "rb") as bodies,
        open(flows_path, "wb") as target,
    ):
        writer = io.FlowWriter(target)
        for line in source:
            try:
                flow = to_flow(json.loads(line), bodies)
            except (ValueError, KeyError, TypeError, OverflowError):
                skipped += 1
                continue
            writer.add(flow)
            written += 1
    return written, skipped


#: Exit status when no exchange was written: the task's earlier recording stays.
NOTHING = 3

if __name__ == "__main__":
    done, bad = convert(sys.argv[1], sys.argv[2], sys.argv[3])
    if bad:
        print(f"web_exchanges: {bad} line(s) skipped, {done} written", file=sys.stderr)
    sys.exit(0 if done else NOTHING)
