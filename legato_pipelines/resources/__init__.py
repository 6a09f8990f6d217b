"""Dagster resources: the policy server, the desktop pool, the lake, the checkpoint source."""

from .checkpoints import Checkpoint, CheckpointSourceResource
from .desktops import DesktopPoolResource
from .lake import LakeResource
from .policy import PolicyResource

__all__ = [
    "Checkpoint",
    "CheckpointSourceResource",
    "DesktopPoolResource",
    "LakeResource",
    "PolicyResource",
]
