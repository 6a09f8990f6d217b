"""Public names a package hands on lazily (PEP 562), so importing it stays cheap.

A desktop server process imports ``legato_pipelines`` and ``legato_pipelines.desktops.server``
for a few light names; the client side (httpx, the engine, the osworld worker's channel) is
imported only by whoever uses it (issue 18: a server's start-up CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_getattr(package: str, names: dict[str, str], namespace: dict[str, Any]) -> Callable:
    """The module ``__getattr__`` of ``package`` (its ``__name__``): a name of ``names``
    (name -> module, relative to ``package``) is imported from its module on first use and
    kept in ``namespace`` (the package's ``globals()``); any other name raises
    ``AttributeError`` as a module would."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module, package), name)
        namespace[name] = value
        return value

    return __getattr__
