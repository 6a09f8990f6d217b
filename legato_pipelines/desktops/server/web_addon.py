"""The mitmproxy addon of the desktops' web replay (:mod:`.recorder`): loaded by ``mitmdump -s``
in the web venv's interpreter, so it imports mitmproxy (lazily) and the standard library only,
never the project.

Option (``--set NAME=VALUE``):

- ``legato_misses``: a request the archive does not answer (mitmproxy's ``server_replay`` has
  no flow for it, asked through its own ``next_flow``; its ``server_replay_extra=forward``
  then leaves our answer alone) is appended to this JSON-lines file (``{"method", "url"}``)
  and answered 404 here, never forwarded.

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
        # this hook runs before mitmproxy's server_replay's: ask it whether it has the answer
        # (with server_replay_reuse, next_flow takes nothing from the archive)
        replay = ctx.master.addons.get("serverplayback")
        if replay is not None and replay.flowmap and replay.next_flow(flow) is not None:
            return
        with open(ctx.options.legato_misses, "a", encoding="utf-8") as out:
            out.write(json.dumps({"method": flow.request.method, "url": flow.request.url}) + "\n")
        flow.response = http.Response.make(404, MISS_BODY, {"content-type": "text/plain"})


addons = [LegatoWeb()]
