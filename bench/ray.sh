#!/usr/bin/env bash
# ferrofeed.ray against the native loader and ray.data.read_images +
# torchvision (see bench/ray.py). Usage: bash bench/ray.sh [--count N] [--rounds R] [--epochs E]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-bench/.venv}   # an existing venv with torch, torchvision and ray[data] can be named here
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -c "import torch, torchvision, ray.data, PIL, maturin" 2>/dev/null ||
  "$VENV/bin/pip" install -q torch torchvision pillow numpy 'ray[data]' maturin
"$VENV/bin/pip" install -q ./python
cargo build --release -q --bin ferrofeed -p ferrofeed
mkdir -p bench/out
"$VENV/bin/python" bench/ray.py "$@"
