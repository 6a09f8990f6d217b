"""AT-SPI on a local desktop: apps with their accessibility on, and OSWorld's ``/accessibility``.

OSWorld's VM answers ``GET /accessibility`` with the AT-SPI tree of the GNOME session
(:mod:`.a11y_dump` has its shape). A local desktop with a session bus of its own
(:mod:`.dbus_session`) and Debian's AT-SPI (``at-spi2-core``: the accessibility bus, activated
on the session bus as ``org.a11y.Bus``; ``python3-pyatspi`` for the system ``python3``) has
the same tree:

- every process of the desktop gets :data:`A11Y_ENV` instead of the ``NO_AT_BRIDGE=1
  GTK_A11Y=none`` that keeps desktops without a bus from autolaunching at-spi (GTK 3 loads
  its AT-SPI bridge by itself; Qt (VLC), Chromium and Mozilla apps need their flag);
  the accessibility bus and its registry are started by the session bus on the first client,
  belong to the task and die at reset like every other activated service;
- ``/accessibility`` runs :mod:`.a11y_dump` with ``/usr/bin/python3`` inside the desktop as its
  user (:func:`dump_argv`) and returns its XML; when AT-SPI is not there or the dump fails, it
  falls back to the minimal tree of one ``<frame>`` per window (``windows.py``).

LibreOffice exposes its tree only with its GTK 3 front end (``libreoffice-gtk3``, chosen by
``SAL_USE_VCLPLUGIN=gtk3`` when installed); with the plain X11 one it is absent from the tree.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import a11y_dump

#: The system interpreter that has Debian's pyatspi (not the desktop's ``python``).
SYSTEM_PYTHON = "/usr/bin/python3"
#: Debian's accessibility bus launcher (package ``at-spi2-core``).
BUS_LAUNCHER = "/usr/libexec/at-spi-bus-launcher"
PYATSPI = "/usr/lib/python3/dist-packages/pyatspi"
LO_GTK3 = "/usr/lib/libreoffice/program/libvclplug_gtk3lo.so"
#: Seconds a dump may take (OSWorld's server has no limit; a big Calc sheet takes a few).
DUMP_TIMEOUT_S = 30.0
#: Accessibility flags of the toolkits the apps use (GTK 3 needs none).
A11Y_ENV = {
    "QT_ACCESSIBILITY": "1",
    "QT_LINUX_ACCESSIBILITY_ALWAYS_ON": "1",
    "ACCESSIBILITY_ENABLED": "1",
    "GNOME_ACCESSIBILITY": "1",
}
#: What desktops without AT-SPI get: no app looks for an accessibility bus.
NO_A11Y_ENV = {"NO_AT_BRIDGE": "1", "GTK_A11Y": "none"}


def missing() -> list[str]:
    """The Debian packages AT-SPI on local desktops still needs (empty: all there)."""
    needs = []
    if not os.access(BUS_LAUNCHER, os.X_OK):
        needs.append("at-spi2-core")
    if not (os.access(SYSTEM_PYTHON, os.X_OK) and Path(PYATSPI).is_dir()):
        needs.append("python3-pyatspi")
    return needs


def task_env(session_bus: bool) -> dict[str, str]:
    """The accessibility part of a desktop's task environment: :data:`A11Y_ENV` (and
    ``SAL_USE_VCLPLUGIN=gtk3`` with LibreOffice's GTK 3 front end) when the desktop has a
    session bus and AT-SPI is installed, else :data:`NO_A11Y_ENV`."""
    if not session_bus or missing():
        return dict(NO_A11Y_ENV)
    env = dict(A11Y_ENV)
    if os.path.exists(LO_GTK3):
        env["SAL_USE_VCLPLUGIN"] = "gtk3"
    return env


def dump_argv() -> list[str]:
    """``python3 -c <a11y_dump's source>``: the dump as a command for inside the desktop."""
    return [SYSTEM_PYTHON, "-c", Path(a11y_dump.__file__).read_text()]
