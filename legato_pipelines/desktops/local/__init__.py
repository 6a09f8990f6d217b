"""Local desktops: real X11 desktops on Xvfb, one server process per desktop.

``LocalDesktop`` (the ``local`` backend), ``open_local_desktops`` (start N servers or attach
to URLs), ``ServerProcess`` (one desktop server this process owns), ``sandbox_options`` (the sandbox
and network options, checked), ``DEFAULT_TOKEN_ENV``, and
``DesktopClient`` (OSWorld's server API + ``/legato/``, from :mod:`..client`). This is what
other parts may use of the backend: the osworld backend's provider ``local`` runs a local
desktop server as its "VM", the remote pool attaches to servers by URL. Importing this
package needs no X libraries; the server (``.server``) does.
"""

from typing import TYPE_CHECKING

from ...lazy import lazy_getattr
from .wire import DEFAULT_TOKEN_ENV

#: Names imported on first use (PEP 562): the desktop server (``.server``, a package module)
#: needs none of the client side (httpx, the backend, the osworld worker's channel).
_LAZY = {
    "DesktopClient": "..client",
    "action_json": "..client",
    "LocalDesktop": ".backend",
    "ServerProcess": ".backend",
    "open_local_desktops": ".backend",
    "sandbox_options": "..network",
}

if TYPE_CHECKING:
    from ..client import DesktopClient, action_json
    from ..network import sandbox_options
    from .backend import LocalDesktop, ServerProcess, open_local_desktops


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


__all__ = [
    "DEFAULT_TOKEN_ENV",
    "DesktopClient",
    "LocalDesktop",
    "ServerProcess",
    "action_json",
    "open_local_desktops",
    "sandbox_options",
]
