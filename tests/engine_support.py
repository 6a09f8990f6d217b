"""What the engine, CLI and Dagster tests share: the test policy key and inline fake tasks."""

from __future__ import annotations

#: The API key the tests put in ``LEGATO_POLICY_KEY`` (checked never to leak into outputs).
SECRET = "sk-legato-TEST-SECRET-0123456789"


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
