"""The mitmproxy addon of the desktops' web replay (:mod:`.recorder`): loaded by ``mitmdump -s``
in the web venv's interpreter, so it imports mitmproxy (lazily) and the standard library only,
never the project.

Option (``--set NAME=VALUE``):

- ``legato_misses``: a request the archive does not answer (mitmproxy's ``server_replay`` has
  no flow for it: its own ``_hash`` looked up in its ``flowmap``; its
  ``server_replay_extra=forward`` then leaves our answer alone) is appended to this
  JSON-lines file (``{"method", "url"}``) and answered 404 here, never forwarded. So is a
  tunnel that carries no HTTP (``tcp_start``: ``{"method": "CONNECT", "url":
  "tcp://host:port"}``); mitmproxy would relay its bytes to the server, so every server
  connection is refused (``server_connect``: the replay connects to nothing, whatever asks).

The order of answers: mitmproxy runs with ``server_replay_reuse=false`` (each recorded answer
serves one request, in the recorded order: a page whose answer changed during the recording
replays the change) and this addon keeps the last answer of each request for every later
one (``reuse`` would serve the first forever; no reuse would make the n+1th a miss).

Recording is not mitmproxy's: ``web_recorder/main.go`` records, :mod:`.web_exchanges` writes
the flow file.
"""

from __future__ import annotations

import json

MISS_BODY = b"legato web replay: this request is not in the archive\n"


class LegatoWeb:
    """The addon (module docstring)."""

    def load(self, loader) -> None:
        loader.add_option("legato_misses", str, "", "replay: JSON-lines file of misses")

    def request(self, flow) -> None:
        from mitmproxy import ctx, http

        if not ctx.options.legato_misses or flow.response is not None:
            return
        # this hook runs before mitmproxy's server_replay's (scripts load first): look the
        # request up as it will, without taking the answer
        replay = ctx.master.addons.get("serverplayback")
        answers = replay.flowmap.get(replay._hash(flow)) if replay is not None else None
        if answers and any(f.response for f in answers):
            if len(answers) == 1:
                answers.append(answers[0])  # the last answer serves every later request
            return
        self._miss(flow.request.method, flow.request.url)
        flow.response = http.Response.make(404, MISS_BODY, {"content-type": "text/plain"})

    def tcp_start(self, flow) -> None:
        from mitmproxy import ctx

        if ctx.options.legato_misses:
            host, port = flow.server_conn.address or ("", 0)
            self._miss("CONNECT", f"tcp://{host}:{port}")

    def server_connect(self, data) -> None:
        from mitmproxy import ctx

        if ctx.options.legato_misses:  # replaying: no server is ever connected to
            data.server.error = "legato web replay connects to no server"

    def _miss(self, method: str, url: str) -> None:
        from mitmproxy import ctx

        with open(ctx.options.legato_misses, "a", encoding="utf-8") as out:
            out.write(json.dumps({"method": method, "url": url}) + "\n")


addons = [LegatoWeb()]
