"""Local desktops: real X11 desktops on Xvfb, one server process per desktop.

``LocalDesktop`` (the ``local`` backend), ``open_local_desktops`` (start N servers or attach
to URLs), ``DesktopClient`` (OSWorld's server API + ``/legato/``) and ``ServerProcess``.
Importing this package needs no X libraries; the server (``.server``) does.
"""

from .backend import LocalDesktop, ServerProcess, open_local_desktops
from .client import DesktopClient, action_json

__all__ = ["DesktopClient", "LocalDesktop", "ServerProcess", "action_json", "open_local_desktops"]
