"""The policy side: config, async client, wire-format normalization, ``probe`` and the
scripted policy server (NOT a model; for tests, demos and wiring up trainers).

The scripted server is imported on first use (it pulls in starlette and uvicorn).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import PolicyClient
from .config import PolicyConfig
from .key import API_KEY_ENV, policy_api_key
from .probe import ProbeReport, probe  # eager: the function shadows the submodule name
from .response import PolicyResponse

if TYPE_CHECKING:
    from .scripted import Faults, Latency, ScriptedPolicyServer

_LAZY = {
    "Faults": "scripted",
    "Latency": "scripted",
    "ScriptedPolicyServer": "scripted",
}

__all__ = [
    "API_KEY_ENV",
    "Faults",
    "Latency",
    "PolicyClient",
    "PolicyConfig",
    "PolicyResponse",
    "ProbeReport",
    "ScriptedPolicyServer",
    "policy_api_key",
    "probe",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
