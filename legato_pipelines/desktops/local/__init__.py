"""Local desktops: real X11 desktops on Xvfb, one server process per desktop.

``LocalDesktop`` (the ``local`` backend), ``open_local_desktops`` (start N servers or attach
to URLs), ``ServerProcess`` (one desktop server this process owns), ``sandbox_options`` (the sandbox
and network options, checked), ``DEFAULT_TOKEN_ENV``, and
``DesktopClient`` (OSWorld's server API + ``/legato/``, from :mod:`..client`). This is what
other parts may use of the backend: the osworld backend's provider ``local`` runs a local
desktop server as its "VM", the remote pool attaches to servers by URL. Importing this
package needs no X libraries; the server (``.server``) does.
"""

from ..client import DesktopClient, action_json
from .backend import LocalDesktop, ServerProcess, open_local_desktops, sandbox_options
from .wire import DEFAULT_TOKEN_ENV

__all__ = [
    "DEFAULT_TOKEN_ENV",
    "DesktopClient",
    "LocalDesktop",
    "ServerProcess",
    "action_json",
    "open_local_desktops",
    "sandbox_options",
]
