"""Shared fixtures: a real scripted policy server on loopback, task lists, run directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SECRET = "sk-legato-TEST-SECRET-0123456789"


@pytest.fixture
def policy_server():
    """A scripted OpenAI-compatible server speaking vLLM's wire format on 127.0.0.1."""
    from legato_pipelines.policy.scripted import ScriptedPolicyServer

    with ScriptedPolicyServer(flavor="vllm") as server:
        yield server


def fake_tasks(n: int, success: float = 0.5, prefix: str = "fake") -> list[dict]:
    """``n`` inline tasks for the fake backend, each with success probability ``success``."""
    return [
        {
            "task_id": f"{prefix}-{i:03d}",
            "config": {
                "instruction": f"Fake task number {i}: open the file and save it.",
                "fake": {"success": success},
            },
        }
        for i in range(n)
    ]


@pytest.fixture
def no_policy_key(monkeypatch):
    monkeypatch.delenv("LEGATO_POLICY_KEY", raising=False)


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch):
    # Tests never read a developer's real key by accident.
    if os.environ.get("LEGATO_POLICY_KEY") and os.environ["LEGATO_POLICY_KEY"] != SECRET:
        monkeypatch.delenv("LEGATO_POLICY_KEY")
