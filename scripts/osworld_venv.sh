#!/usr/bin/env bash
# The osworld backend's two interpreters, for tests and for `--osworld-provider local`:
#  1. the OSWorld venv (desktop-env 1.0.2 --no-deps + the "core" recipe, docs/osworld.md §8),
#     default ~/.cache/legato/osworld-venv (LEGATO_OSWORLD_VENV overrides);
#  2. the "VM python" of local desktops: OSWorld's in-VM server runs `python -c "import
#     pyautogui; ..."`, so the desktop's PATH needs a `python` with pyautogui and tkinter
#     (python-is-python3, python3-tk; pyautogui's pure-Python wheels into /usr/local).
# Idempotent; ~1 min and ~0.8 GB the first time, seconds after.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in python-is-python3 python3-tk; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

VM_SITE="$(/usr/bin/python3 -c 'import site; print(next(p for p in site.getsitepackages() if p.startswith("/usr/local")))')"
if ! env -i PATH=/usr/local/bin:/usr/bin:/bin python -c 'import importlib.util as u, Xlib; assert u.find_spec("pyautogui")' 2>/dev/null; then
  python3 -m pip install -q --disable-pip-version-check --target "$VM_SITE" --upgrade --no-deps \
    pyautogui pymsgbox pytweening pyscreeze pygetwindow pyrect mouseinfo pyperclip python-xlib six
fi

python3 -m legato_pipelines osworld install --full
