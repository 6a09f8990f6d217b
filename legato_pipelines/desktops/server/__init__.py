"""The desktop server building block: real X11 desktops on Xvfb, one server process per desktop.

Server side: ``main.py`` (the HTTP server: OSWorld's in-VM API plus ``/legato/``), forked from
``template.py``, with the session, sandbox, apps and X modules beside it. Client side:
``LocalDesktop`` (the ``local`` backend's desktop), ``open_local_desktops`` (start N servers),
``ServerProcess`` (one desktop server this process owns), ``remote.py`` / ``vmserver.py``
(servers attached by URL), ``sandbox_options`` (the sandbox and network options, checked),
``DEFAULT_TOKEN_ENV``, and ``DesktopClient`` (OSWorld's server API + ``/legato/``, from
:mod:`..client`). This face is what other building blocks may use: the osworld worker's
provider ``local`` runs a desktop server as its "VM". Importing this package needs no X
libraries; the server (``.main``) does.
"""

from typing import TYPE_CHECKING

from ...lazy import lazy_getattr
from .wire import DEFAULT_TOKEN_ENV

#: Names imported on first use (PEP 562): the desktop server (``.server``, a package module)
#: needs none of the client side (httpx, the backend, the osworld worker's channel).
_LAZY = {
    "DesktopClient": "..client",
    "action_json": "..client",
    "LocalDesktop": ".desktop",
    "ServerProcess": ".desktop",
    "open_local_desktops": ".desktop",
    "sandbox_options": "..network",
}

if TYPE_CHECKING:
    from ..client import DesktopClient, action_json
    from ..network import sandbox_options
    from .desktop import LocalDesktop, ServerProcess, open_local_desktops


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
