#!/usr/bin/env bash
# The local desktops' web recorder (desktop option web=record:/replay:, `legato web record`):
# mitmproxy 11.0.2 in a venv of its own, default ~/.cache/legato/web-venv (LEGATO_WEB_VENV
# overrides; legato_pipelines/desktops/server/recorder.py). Its pins (h11, h2, cryptography,
# pyOpenSSL, urwid...) stay out of the project's environment: the desktop server runs
# `mitmdump` from here. Idempotent: seconds when installed, ~30 s and ~130 MB the first time.
set -euo pipefail
VENV="${LEGATO_WEB_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/legato/web-venv}"
if ! "$VENV/bin/mitmdump" --version 2>/dev/null | grep -q "Mitmproxy: 11.0.2"; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check mitmproxy==11.0.2
fi
