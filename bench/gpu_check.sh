#!/usr/bin/env bash
# One short check of the CUDA path on a machine with a GPU (≤ 5 minutes):
# builds with the cudarc driver bindings (loaded at run time; no toolkit
# needed), measures pinned vs pageable host-to-device bandwidth for 64 MiB
# batches against a raw cudarc copy loop, and runs the vision pipeline to the
# device, comparing every device batch with its host batch.
# Usage: bash bench/gpu_check.sh   (exit 0 pass, 1 fail, 2 no CUDA device)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "cargo is needed (rustup)"; exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
cargo build --release --example gpu_check 2>&1 | tail -2
timeout 240 target/release/examples/gpu_check
