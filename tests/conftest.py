"""Fixtures and hooks only (helpers the test modules import live in ``tests/*_support.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.engine_support import SECRET


@pytest.fixture
def policy_server():
    """A scripted OpenAI-compatible server speaking vLLM's wire format on 127.0.0.1."""
    from legato_pipelines.policy.scripted import ScriptedPolicyServer

    with ScriptedPolicyServer(flavor="vllm") as server:
        yield server


@pytest.fixture
def no_policy_key(monkeypatch):
    monkeypatch.delenv("LEGATO_POLICY_KEY", raising=False)


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _load_state(monkeypatch, tmp_path_factory):
    # Server locks, adapter leases and loaded fingerprints (policy/servers.py) per test session,
    # never in the developer's ~/.cache or DAGSTER_HOME.
    monkeypatch.setenv("LEGATO_LOAD_STATE", str(tmp_path_factory.getbasetemp() / "load-state"))


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch):
    # Tests never read a developer's real key by accident.
    if os.environ.get("LEGATO_POLICY_KEY") and os.environ["LEGATO_POLICY_KEY"] != SECRET:
        monkeypatch.delenv("LEGATO_POLICY_KEY")


@pytest.fixture(scope="session")
def vllm_models(tmp_path_factory):
    """The tiny random-weight models the real-vLLM tests serve, built once per session
    (``tests/vllm_tiny_models.py``): ``{"qwen3_vl": folder}``. Skips when the vLLM venv is
    missing (CI installs it: scripts/setup.sh)."""
    from tests.vllm_support import build_model, missing_reason, vllm_python

    if vllm_python() is None:
        pytest.skip(missing_reason())
    root = tmp_path_factory.mktemp("vllm-models")
    return {"qwen3_vl": build_model(root / "tiny-qwen3-vl", "qwen3_vl")}


@pytest.fixture(scope="session")
def vllm_server(vllm_models, tmp_path_factory):
    """ONE real vLLM server per test session on 127.0.0.1 serving the tiny Qwen3-VL (the
    default harness's model family), LoRA enabled (``tests/vllm_support.py`` says how and why); stopped at the session's end."""
    from tests.vllm_support import VllmServer

    log = tmp_path_factory.mktemp("vllm-server") / "vllm.log"
    server = VllmServer(vllm_models["qwen3_vl"], log).start()
    try:
        yield server
    finally:
        server.stop()
