"""Dagster sensors of the code location."""

from .checkpoints import checkpoint_sensor

__all__ = ["checkpoint_sensor"]
