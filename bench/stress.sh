#!/usr/bin/env bash
# Eight pipelines sharing one source, concurrently, for SECONDS (default 180):
# no deadlock (a watchdog), byte budgets held. Usage: bash bench/stress.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
FERROFEED_STRESS_SECONDS=${1:-180} cargo test --release --test stress -- --ignored --nocapture
