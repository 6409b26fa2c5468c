#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60) with cargo-fuzz
# (nightly; `cargo install cargo-fuzz`), seeded from the test fixtures, and
# prints the executions each reached. Crashes land in fuzz/artifacts/<target>/;
# turn any into a regression test. Not run in CI.
# Usage: bash fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_EACH=${1:-60}
mkdir -p corpus/jpeg_decode corpus/jpeg_train_crop corpus/audio_decode corpus/text_line corpus/state_json corpus/resample
cp ../tests/data/vision/*.jpg corpus/jpeg_decode/ 2>/dev/null || true
cp ../tests/data/vision/*.jpg corpus/jpeg_train_crop/ 2>/dev/null || true
for f in ../tests/data/audio/*.wav ../tests/data/audio/*.flac ../tests/data/audio/*.mp3 ../tests/data/audio/*.ogg; do
  # First byte picks the container hint: 0 wav, 1 flac, 2 mp3, 3 ogg.
  case "$f" in *.wav) k='\x00';; *.flac) k='\x01';; *.mp3) k='\x02';; *) k='\x03';; esac
  { printf "$k"; head -c 20000 "$f"; } > "corpus/audio_decode/$(basename "$f")"
done
head -50 ../domains/text/data/corpus.txt | split -l 1 - corpus/text_line/line-
printf '{"text": "a json line"}' > corpus/text_line/json
(cd .. && cargo run --release -q -- text --quiet --limit-batches 2 \
  --save-state fuzz/corpus/state_json/state > /dev/null)
cargo +nightly fuzz build -O 2>&1 | tail -1
TARGETS=("${@:2}")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(jpeg_decode jpeg_train_crop audio_decode text_line state_json resample)
for t in "${TARGETS[@]}"; do
  log=$(mktemp)
  cargo +nightly fuzz run -O "$t" "corpus/$t" -- -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 > "$log" 2>&1 || {
    echo "$t: FAILED (see fuzz/artifacts/$t)"; tail -30 "$log"; continue; }
  execs=$(grep -o "Done [0-9]* runs" "$log" | awk '{print $2}')
  echo "$t: $execs executions in ${SECONDS_EACH} s, no crash"
done
