#!/usr/bin/env bash
# Memory of a long file: one hour of audio (16-bit mono WAV at 16 kHz, and
# 44.1 kHz FLAC) through `ferrofeed audio` (10 s chunks → log-mel) under a
# 64 MiB byte budget; prints peak RSS (from /usr/bin/time -v) next to the
# file size. Usage: bash bench/audio_long_file.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=bench/out
mkdir -p "$OUT"
command -v /usr/bin/time >/dev/null || apt-get install -y -qq time
cargo build --release -q --bin ferrofeed -p ferrofeed
FF=target/release/ferrofeed
for spec in "16000 wav" "44100 flac"; do
  set -- $spec
  D="$OUT/audio-1h-$1-$2"
  [ -d "$D" ] || "$FF" make-dataset audio "$D" --count 1 --min-seconds 3600 --max-seconds 3600 \
    --rate "$1" --format "$2" --channels 1
  /usr/bin/time -v "$FF" audio "$D" --max-bytes-in-flight 64MiB --quiet \
    --report-json "$OUT/audio_1h_$1.json" > /dev/null 2> "$OUT/audio_1h_$1.time"
  rss=$(grep "Maximum resident" "$OUT/audio_1h_$1.time" | awk '{print $6}')
  size=$(du -k "$D" | tail -1 | cut -f1)
  python3 -c "import json,sys; r=json.load(open('$OUT/audio_1h_$1.json')); print(f'$1 Hz $2: file {int(\"$size\")/1024:.0f} MiB, {r[\"audio_seconds\"]:.0f} s of audio, {r[\"samples\"]} chunks, peak RSS {int(\"$rss\")/1024:.0f} MiB, peak bytes in flight {r[\"peak_bytes_in_flight\"]/2**20:.1f} MiB (budget 64 MiB), {r[\"audio_seconds_per_s\"]:.0f} audio-s/s')"
done
