#!/usr/bin/env bash
# All set-up on a fresh Debian/Ubuntu machine: the desktop packages (Xvfb, a window manager,
# real apps), Chromium for the UI test, and the Python package with its dev extras.
# Idempotent: re-running it installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  # local desktops (the `local` backend): display, window manager, input/debug tools, apps
  xvfb openbox x11-utils xdotool wmctrl dbus-daemon dbus-x11 fonts-dejavu-core
  # the desktops' sandboxes (util-linux's unshare/nsenter are essential packages)
  tini sudo iproute2
  xterm l3afpad libreoffice-calc
  # OSWorld's other apps, from Debian (desktops/server/apps.py DESKTOP_APPS): ~195 MB of archives,
  # Thunderbird 80 MB of them
  libreoffice-writer libreoffice-impress gimp vlc thunderbird nautilus gnome-terminal
  # GNOME's Document Viewer (the VM's PDF viewer), Videos (the VM's default video player,
  # desktops/server/mime_defaults.py) and MusicBrainz Picard: 68 packages, 20 MB of archives
  evince totem picard
  # their session D-Bus with dconf, so gsettings persists (desktops/server/dbus_session.py), and
  # the GNOME schemas and helpers OSWorld's os tasks read (gnome-shell's and the settings
  # daemon's schemas only, not the programs; bc in evaluator commands): ~2 MB
  dconf-service dconf-gsettings-backend libglib2.0-bin gsettings-desktop-schemas
  gnome-shell-common gnome-settings-daemon-common bc
  # headless browser for the Dagster UI end-to-end test; inside desktops it is `google-chrome`
  # (desktops/server/chrome.py), with socat for OSWorld's DevTools bridge (9222 -> 1337)
  chromium socat
  # AT-SPI behind /accessibility (desktops/server/accessibility.py): the accessibility bus and
  # pyatspi for the system python3: ~0.7 MB (at-spi2-core often there already)
  at-spi2-core python3-pyatspi
  # the `vm` desktop session (desktops/server/vm_look.py): top bar and dock, Yaru theme and
  # icons, Cantarell for the "Ubuntu" font
  tint2 yaru-theme-gtk yaru-theme-icon fonts-cantarell
  # LibreOffice's GTK 3 front end: without it LibreOffice is not in the accessibility tree, and
  # tasks graded from the tree (Impress's slide pane) score 0 when solved (2.2 MB; issue 33)
  libreoffice-gtk3
  # pasta: desktops' own networks with a route out and their CDP/VLC ports forwarded
  # (--network own, desktops/server/sandbox.py): 0.4 MB
  passt
  # certutil: the desktops' Chromium trusts the web recorder's CA (and web_ca) through an NSS
  # database in the baseline HOME (desktops/server/recorder.py)
  libnss3-tools
  # bwrap: the web recorder runs confined (desktops/server/recorder.py): 0.1 MB
  bubblewrap
  # Go and Google's martian (its mitm certificates): scripts/web_venv.sh builds the recording proxy
  # (desktops/server/web_recorder/main.go); ~86 MB of archives
  golang-go golang-github-google-martian-dev
  # the sandbox escape tests build a small /etc/ld.so.preload library (tests/test_desktop_sandbox_escapes.py)
  gcc libc6-dev
  # scale-out proof (Postgres run storage, Redis broker for Celery run workers)
  postgresql redis-server
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

python3 -m pip install -q -e '.[dev]'

# The osworld backend: OSWorld's desktop-env in its own venv, and pyautogui for the local
# desktops' "VM python" (see scripts/osworld_venv.sh).
scripts/osworld_venv.sh

# The local desktops' web recorder: mitmproxy and the recording proxy in a venv of their own
# (see scripts/web_venv.sh).
scripts/web_venv.sh

# The real-vLLM tests (tests/test_vllm_real.py) and benchmarks/bench_vllm_client.py: vLLM's CPU
# build in its own venv (see scripts/vllm_venv.sh; 2-3 min and ~6.3 GB the first time).
scripts/vllm_venv.sh
