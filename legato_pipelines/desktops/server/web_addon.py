"""The mitmproxy addon of the desktops' web recorder (:mod:`.recorder`): loaded by ``mitmdump
-s`` in the web venv's interpreter, so it imports mitmproxy (lazily) and the standard library
only, never the project.

Options (``--set NAME=VALUE``):

- ``legato_hosts``: JSON ``{"name": "addr:port"}`` (or ``"addr"``: the request's port): the
  server connections for those names go to that address instead of what the name resolves to
  (the TLS server name stays the name). Stand-in sites and mirrors; the test's stand-ins on
  loopback.
- ``legato_misses``: replay only: a request the archive does not answer (mitmproxy's
  ``server_replay`` has no flow for it, asked through its own ``next_flow``; its
  ``server_replay_extra=forward`` then leaves our answer alone) is appended to this
  JSON-lines file (``{"method", "url"}``) and answered 404 here, never forwarded.
- ``legato_flows``: record only: the flow file every exchange is written to (mitmproxy's own
  ``io.FlowWriter``: the format of ``mitmdump -w``, read by ``--server-replay``), written off
  the steps: a finished flow (``response``, ``error``, a WebSocket's, TCP's, UDP's or DNS's
  end: the hooks on which ``-w`` writes) is held in memory and the held flows are written when
  the held HTTP bodies exceed ``legato_hold_mib`` MiB or :data:`HOLD_FLOWS` flows, and at
  mitmproxy's ``done`` (the attempt's end: SIGTERM), with the flows still unanswered then
  (as ``-w`` does). Serializing the flows was a third of mitmproxy's CPU on a page load
  (BENCHMARKS.md, issue 34); a mitmdump killed (SIGKILL) loses the held flows. A held flow
  is written as it is then: its connections' end times may be filled in (``-w`` writes
  them as they were at the response).
"""

from __future__ import annotations

import json

MISS_BODY = b"legato web replay: this request is not in the archive\n"
#: Held flows written at once when they are this many, whatever their size (bounds the
#: attempt's end: ~1 ms of serializing per flow on a loaded core).
HOLD_FLOWS = 1000


class LegatoWeb:
    """The addon (module docstring)."""

    def load(self, loader) -> None:
        loader.add_option("legato_hosts", str, "{}", "JSON {name: 'addr:port'}")
        loader.add_option("legato_misses", str, "", "replay: JSON-lines file of misses")
        loader.add_option("legato_flows", str, "", "record: flow file, written off the steps")
        loader.add_option("legato_hold_mib", int, 64, "record: held bodies written beyond this")
        self.held: list = []
        self.held_bytes = 0
        self.open: dict = {}  # id -> flow: requests not answered yet (written at done)
        self.file = None

    def server_connect(self, data) -> None:
        from mitmproxy import ctx

        hosts = json.loads(ctx.options.legato_hosts or "{}")
        host, port = data.server.address
        target = hosts.get(host)
        if target:
            addr, _, mapped = (
                str(target).rpartition(":") if ":" in str(target) else (target, "", "")
            )
            if data.server.sni is None:
                data.server.sni = host
            data.server.address = (addr or str(target), int(mapped) if mapped else port)

    def request(self, flow) -> None:
        from mitmproxy import ctx, http

        if not ctx.options.legato_misses or flow.response is not None:
            return
        # this hook runs before mitmproxy's server_replay's: ask it whether it has the answer
        # (with server_replay_reuse, next_flow takes nothing from the archive)
        replay = ctx.master.addons.get("serverplayback")
        if replay is not None and replay.flowmap and replay.next_flow(flow) is not None:
            return
        with open(ctx.options.legato_misses, "a", encoding="utf-8") as out:
            out.write(json.dumps({"method": flow.request.method, "url": flow.request.url}) + "\n")
        flow.response = http.Response.make(404, MISS_BODY, {"content-type": "text/plain"})

    # the deferred flow file (module docstring: legato_flows)

    def _finished(self, flow) -> None:
        from mitmproxy import ctx

        if not ctx.options.legato_flows:
            return
        self.open.pop(flow.id, None)
        self.held.append(flow)
        for message in (getattr(flow, "request", None), getattr(flow, "response", None)):
            self.held_bytes += len(getattr(message, "raw_content", None) or b"")
        if (
            len(self.held) >= HOLD_FLOWS
            or self.held_bytes > ctx.options.legato_hold_mib * 1024 * 1024
        ):
            self._write([])

    def configure(self, updated) -> None:
        from mitmproxy import ctx

        if "legato_flows" in updated and ctx.options.legato_flows and self.file is None:
            self.file = open(ctx.options.legato_flows, "wb")  # at the start, as -w opens it

    def _write(self, more) -> None:
        from mitmproxy import io

        writer = io.FlowWriter(self.file)
        for flow in [*self.held, *more]:
            writer.add(flow)
        self.file.flush()
        self.held, self.held_bytes = [], 0

    def requestheaders(self, flow) -> None:
        from mitmproxy import ctx

        if ctx.options.legato_flows:
            self.open[flow.id] = flow

    tcp_start = udp_start = dns_request = requestheaders

    def response(self, flow) -> None:
        if flow.websocket is None:  # a WebSocket's flow is written at its end
            self._finished(flow)

    def error(self, flow) -> None:
        self.response(flow)

    def websocket_end(self, flow) -> None:
        self._finished(flow)

    tcp_end = tcp_error = udp_end = udp_error = dns_response = dns_error = websocket_end

    def done(self) -> None:
        from mitmproxy import ctx

        if ctx.options.legato_flows:
            self._write(list(self.open.values()))
            self.open.clear()
            self.file.close()


addons = [LegatoWeb()]
