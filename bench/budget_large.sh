#!/usr/bin/env bash
# Peak bytes in flight and peak RSS of `ferrofeed vision --transform none`
# over camera-sized JPEGs under small byte budgets: the budget must hold
# however large a sample is (expected: bytes in flight ≤ budget + one batch,
# RSS ≤ budget + ~100 MiB).
# Usage: bash bench/budget_large.sh [COUNT=48]
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-48}
OUT=bench/out
mkdir -p "$OUT"
cargo build --release -q
FF=target/release/ferrofeed
printf '%-10s %-8s %-8s %14s %12s %10s\n' size budget workers "in flight MiB" "RSS MiB" "images/s"
for size in 2400x1800 6000x4000; do
  dir="$OUT/large-$size-$COUNT"
  [ -d "$dir" ] || "$FF" make-dataset vision "$dir" --count "$COUNT" --image-size "$size" >/dev/null
  cat "$dir"/*/*.jpg >/dev/null
  for budget in 64MiB 256MiB; do
    for workers in auto 1; do
      log=$(mktemp)
      /usr/bin/time -v "$FF" vision "$dir" --transform none --batch-size 2 \
        --max-bytes-in-flight "$budget" --workers "$workers" --quiet \
        --report-json "$log.json" >"$log" 2>&1
      peak=$(python3 -c "import json;print(round(json.load(open('$log.json'))['peak_bytes_in_flight']/2**20,1))")
      rate=$(python3 -c "import json;print(round(json.load(open('$log.json'))['samples_per_s'],1))")
      rss=$(awk '/Maximum resident/ {printf "%.1f", $6/1024}' "$log")
      printf '%-10s %-8s %-8s %14s %12s %10s\n' "$size" "$budget" "$workers" "$peak" "$rss" "$rate"
      rm -f "$log" "$log.json"
    done
  done
done
