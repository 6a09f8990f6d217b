"""Fixtures and hooks only (helpers the test modules import live in ``tests/*_support.py``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.engine_support import SECRET


def pytest_configure(config):
    """A suite started in the background (``nohup``, ``&`` in a script without job control)
    inherits SIGINT, SIGQUIT and SIGHUP ignored, and every process a test starts would inherit
    that too: the tests that stop ``legato`` or a sandboxed process by a signal would test the
    shell's choice, not the code. Put the defaults back for the suite's processes."""
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGQUIT: signal.SIG_DFL}
    defaults[signal.SIGHUP] = signal.SIG_DFL
    for signum, handler in defaults.items():
        if signal.getsignal(signum) is signal.SIG_IGN:
            signal.signal(signum, handler)


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
    (``tests/vllm_tiny_models.py``): ``{"qwen3_vl": folder, "qwen2_5_vl": folder}``. Skips
    when the vLLM venv is missing (CI installs it: scripts/setup.sh)."""
    from tests.vllm_support import build_model, missing_reason, vllm_python

    if vllm_python() is None:
        pytest.skip(missing_reason())
    root = tmp_path_factory.mktemp("vllm-models")
    return {
        "qwen3_vl": build_model(root / "tiny-qwen3-vl", "qwen3_vl"),
        "qwen2_5_vl": build_model(root / "tiny-qwen2.5-vl", "qwen2_5_vl"),
    }


@pytest.fixture(scope="session")
def _vllm_launched(vllm_models, tmp_path_factory):
    """Both real vLLM servers of the session, launched together (each cold start is mostly one
    process importing vLLM, ~1 core: side by side on 2 cores they take about as long as one),
    stopped at the session's end."""
    from tests.vllm_support import VllmServer

    root = tmp_path_factory.mktemp("vllm-servers")
    servers = {
        "main": VllmServer(vllm_models["qwen3_vl"], root / "qwen3-vl.log"),
        "parser": VllmServer(
            vllm_models["qwen2_5_vl"],
            root / "qwen2.5-vl.log",
            served_name="tiny-qwen2.5-vl",
            extra_args=("--reasoning-parser", "qwen3"),
        ),
    }
    try:
        for server in servers.values():
            server.launch()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="session")
def vllm_server(_vllm_launched):
    """THE real vLLM server of the session on 127.0.0.1: the tiny Qwen3-VL (the default
    harness's model family), LoRA enabled (``tests/vllm_support.py`` says how and why)."""
    return _vllm_launched["main"].wait_ready()


@pytest.fixture(scope="session")
def vllm_parser_server(_vllm_launched):
    """The session's second server: the tiny Qwen2.5-VL with vLLM's Qwen3 reasoning parser
    (``--reasoning-parser qwen3``): the other architecture, and an answer that arrives in
    ``message.reasoning``."""
    return _vllm_launched["parser"].wait_ready()
