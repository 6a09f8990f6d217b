#!/usr/bin/env bash
# The local desktops' web recorder (desktop option web=record:/replay:, `legato web record`;
# legato_pipelines/desktops/server/recorder.py), in a venv of its own, default
# ~/.cache/legato/web-venv (LEGATO_WEB_VENV overrides):
# - mitmproxy 11.0.2: replays archives, and turns recordings into its flow files. Its pins (h11,
#   h2, cryptography, pyOpenSSL, urwid...) stay out of the project's environment.
# - bin/legato-web-recorder: the recording proxy, built from
#   legato_pipelines/desktops/server/web_recorder/main.go with Debian's Go and Google's martian
#   (apt: golang-go golang-github-google-martian-dev; scripts/setup.sh installs them). Rebuilt
#   when main.go changes.
# Idempotent: seconds when installed, ~40 s and ~140 MB the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LEGATO_WEB_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/legato/web-venv}"
SOURCE=legato_pipelines/desktops/server/web_recorder
BINARY="$VENV/bin/legato-web-recorder"
STAMP="$(sha256sum "$SOURCE/main.go" | cut -d' ' -f1)"
BUILT=0
[ -x "$BINARY" ] && [ "$(cat "$BINARY.sha256" 2>/dev/null)" = "$STAMP" ] && BUILT=1
# checked first: nothing is installed when the build cannot run
if [ "$BUILT" = 0 ] && { ! command -v go >/dev/null || [ ! -d /usr/share/gocode/src/github.com/google/martian ]; }; then
  echo "web_venv.sh: building the web recorder needs Go and martian:" \
    "apt-get install golang-go golang-github-google-martian-dev" >&2
  exit 1
fi

if ! "$VENV/bin/mitmdump" --version 2>/dev/null | grep -q "Mitmproxy: 11.0.2"; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check mitmproxy==11.0.2
fi

if [ "$BUILT" = 0 ]; then
  BUILD="$(mktemp -d)"
  trap 'rm -rf "$BUILD"' EXIT
  # Debian's Go libraries live in GOPATH form under /usr/share/gocode: no module download
  (cd "$SOURCE" && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$BUILD/cache" GOFLAGS= \
    go build -trimpath -o "$BUILD/legato-web-recorder" .)
  install -m 0755 "$BUILD/legato-web-recorder" "$BINARY"
  echo "$STAMP" > "$BINARY.sha256"
fi
