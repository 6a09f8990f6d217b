"""The stand-in website (:mod:`tests.web_standin`) answered by mitmproxy's ``mitmdump`` in
reverse mode, which speaks HTTP/2 to clients that offer it (ALPN ``h2``: Chromium) and
HTTP/1.1 to the others: the recorder's benchmark's HTTP/2 site (``--site h2``). Loaded by
``mitmdump -s`` in the web venv with the worktree on ``PYTHONPATH``; answers every request
itself (:func:`tests.web_standin.answer`), connects to nothing, and appends each request's
path to the file of option ``standin_log``."""

from __future__ import annotations

from tests.web_standin import answer


class StandInH2:
    """The addon (module docstring)."""

    def load(self, loader) -> None:
        loader.add_option("standin_log", str, "", "file the requests' paths are appended to")

    def request(self, flow) -> None:
        from mitmproxy import ctx, http

        with open(ctx.options.standin_log, "a", encoding="utf-8") as log:
            log.write(f"{flow.request.http_version} {flow.request.path}\n")
        status, headers, body = answer(flow.request.path)
        headers.pop("Content-Length")  # mitmproxy sets it (HTTP/1.1) or leaves it (HTTP/2)
        flow.response = http.Response.make(status, body, headers)


addons = [StandInH2()]
