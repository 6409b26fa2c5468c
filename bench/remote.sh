#!/usr/bin/env bash
# Object storage against the local copy and webdataset (see bench/remote.py):
# 2,048 JPEGs as WebDataset shards and as an ImageFolder tree on moto's S3
# server on loopback, behind a proxy limited to 100 and 50 MB/s.
# Usage: bash bench/remote.sh [--count N] [--rounds R] [--shards-only]
set -euo pipefail
cd "$(dirname "$0")/.."
# The test venv (./test.sh fills it with torch, moto and boto3); VENV names another.
VENV=${VENV:-${FERROFEED_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrofeed/venv}}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -c "import moto.server, boto3, torch, PIL" 2>/dev/null ||
  "$VENV/bin/pip" install -q 'moto[server]' boto3 torch pillow numpy
"$VENV/bin/python" -c "import webdataset" 2>/dev/null || "$VENV/bin/pip" install -q webdataset
command -v curl >/dev/null || (apt-get update -qq && apt-get install -y -qq curl)
# remote.py builds the release binary itself.
PEER_PYTHON="$VENV/bin/python" "$VENV/bin/python" bench/remote.py "$@"
