#!/usr/bin/env bash
# Every test: the Rust workspace, then the Python package (built and
# installed into a virtual environment kept outside the clone, so later runs
# reuse it; FERROFEED_VENV names another one).
set -euo pipefail
cd "$(dirname "$0")"
cargo test --workspace
# The remote-data tests drive the command against moto's S3 server.
cargo build --bin ferrofeed
export FERROFEED_BIN="$PWD/target/debug/ferrofeed"

VENV=${FERROFEED_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrofeed/venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# torch is ~5 GB (PyPI has CUDA builds only; they run on CPU): installed once.
"$VENV/bin/python" -c "import numpy, torch, PIL, pytest, maturin" 2>/dev/null ||
  "$VENV/bin/pip" install -q numpy torch pillow pytest maturin
# torchvision: native=True translates its ImageFolder and transforms.
"$VENV/bin/python" -c "import torchvision" 2>/dev/null ||
  "$VENV/bin/pip" install -q torchvision
# torchdata's StatefulDataLoader: the drop-in's state_dict() is checked against it.
"$VENV/bin/python" -c "import torchdata.stateful_dataloader" 2>/dev/null ||
  "$VENV/bin/pip" install -q torchdata
# moto's S3 server (started on loopback by the tests) and boto3 to fill it.
"$VENV/bin/python" -c "import moto.server, boto3" 2>/dev/null ||
  "$VENV/bin/pip" install -q 'moto[server]' boto3
# Ray Data for ferrofeed.ray (local and two-node clusters started by the tests).
"$VENV/bin/python" -c "import ray.data" 2>/dev/null ||
  "$VENV/bin/pip" install -q 'ray[data]'
"$VENV/bin/pip" install -q ./python
# Run from the root so that `import ferrofeed` is the installed package.
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --rootdir python python/tests
