#!/usr/bin/env bash
# One long file: one hour of audio (16-bit mono WAV at 16 kHz, and 44.1 kHz
# mono FLAC resampled to 16 kHz) through `ferrofeed audio` (10 s chunks →
# log-mel, batches of 8 chunks) under a 64 MiB byte budget, ROUNDS
# interleaved rounds of:
#   - 1 worker,
#   - 2 workers (the file read as 60 s segments, decoded by both),
#   - 2 workers with --segment-seconds 0 (the file whole, on one thread).
# Prints each setting's median audio-seconds per second, the ratio of
# 2 workers to 1 (median of per-round ratios), and peak RSS (/usr/bin/time
# -v) next to the file size. With batches of 32 chunks (320 s of audio) one
# part alone takes half the budget, so the budget lets one worker run at a
# time; batches of 8 leave room for both.
# Usage: bash bench/audio_long_file.sh [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
OUT=bench/out
mkdir -p "$OUT"
command -v /usr/bin/time >/dev/null || apt-get install -y -qq time
cargo build --release -q --bin ferrofeed -p ferrofeed
FF=target/release/ferrofeed
for spec in "16000 wav" "44100 flac"; do
  set -- $spec
  D="$OUT/audio-1h-$1-$2"
  [ -d "$D" ] || "$FF" make-dataset audio "$D" --count 1 --min-seconds 3600 --max-seconds 3600 \
    --rate "$1" --format "$2" --channels 1 > /dev/null
  cat "$D"/* > /dev/null
  for r in $(seq 1 "$ROUNDS"); do
    for setting in "w1:--workers 1" "w2:--workers 2" "w2whole:--workers 2 --segment-seconds 0"; do
      name=${setting%%:*}; flags=${setting#*:}
      /usr/bin/time -v "$FF" audio "$D" $flags --batch-size 8 --max-bytes-in-flight 64MiB --quiet \
        --report-json "$OUT/audio_1h_$1_${name}_$r.json" > /dev/null 2> "$OUT/audio_1h_$1_${name}_$r.time"
    done
  done
  python3 - "$OUT" "$1" "$2" "$ROUNDS" "$(du -k "$D" | tail -1 | cut -f1)" <<'PY'
import json, re, statistics, sys
out, rate, fmt, rounds, size_k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
med = statistics.median
def load(name, r):
    rep = json.load(open(f"{out}/audio_1h_{rate}_{name}_{r}.json"))
    t = open(f"{out}/audio_1h_{rate}_{name}_{r}.time").read()
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1)) / 1024
    return rep["audio_seconds_per_s"], rss, rep
rows = {n: [load(n, r) for r in range(1, rounds + 1)] for n in ["w1", "w2", "w2whole"]}
rep = rows["w1"][0][2]
print(f"{rate} Hz {fmt}: file {size_k / 1024:.0f} MiB, {rep['audio_seconds']:.0f} s of audio, {rep['samples']} chunks, {rounds} rounds")
for n, label in [("w1", "1 worker"), ("w2", "2 workers, 60 s segments"), ("w2whole", "2 workers, --segment-seconds 0")]:
    v = rows[n]
    print(f"  {label:32} {med(x[0] for x in v):8.0f} audio-s/s  peak RSS {med(x[1] for x in v):5.0f} MiB"
          f"  peak in flight {med(x[2]['peak_bytes_in_flight'] for x in v) / 2**20:5.1f} MiB  (all: {', '.join('%.0f' % x[0] for x in v)})")
ratio = med(b[0] / a[0] for a, b in zip(rows["w1"], rows["w2"]))
print(f"  2 workers / 1 worker: {ratio:.2f}x (median of per-round ratios; target 1.8x)")
PY
done
