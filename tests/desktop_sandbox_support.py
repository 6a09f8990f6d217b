"""Shared pieces of the sandbox tests: OSWorld's own task configs from the repository's copy."""

from __future__ import annotations

import json

from legato_pipelines.tasks import Task
from tests.osworld_data import OSWORLD


def osworld_task(task_id: str) -> Task:
    """The OSWorld task whose id starts with ``task_id`` (its config, unmodified)."""
    path = next(OSWORLD.glob(f"*/{task_id}*.json"))
    config = json.loads(path.read_text())
    return Task(task_id=config["id"], domain="os", config=config, source=str(path))
