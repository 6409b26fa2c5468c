#!/usr/bin/env bash
# Audio pipeline: audio-seconds per second of decode (+ resample to 16 kHz)
# + 80-band log-mel for `ferrofeed audio` vs librosa, torchaudio and a
# 2-worker PyTorch DataLoader on the same files, in the same run, for two
# inputs: 40 files of 10–60 s as 16 kHz WAV and as 44.1 kHz FLAC.
# Every contender makes EPOCHS passes over the files and its best pass counts
# (a ferrofeed pass lasts ~0.1 s here: one pass alone measures start-up and
# the machine's noise more than the pipeline). Rounds are interleaved;
# medians and ratios are printed.
# Usage: bash bench/audio_vs_python.sh [ROUNDS] [EPOCHS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
EPOCHS=${2:-5}
CPUS=$(nproc)
OUT=bench/out
VENV=${VENV:-bench/.venv}   # an existing venv with torch can be named here
mkdir -p "$OUT"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import torch, torchaudio, librosa, soundfile" 2>/dev/null; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch torchaudio librosa soundfile numpy
fi
cargo build --release -q --bin ferrofeed -p ferrofeed
FF=target/release/ferrofeed
W="$OUT/audio-wav16k"; F="$OUT/audio-flac44k"
[ -d "$W" ] || "$FF" make-dataset audio "$W" --count 40 --min-seconds 10 --max-seconds 60 --rate 16000 --format wav --channels 1 --seed 1
[ -d "$F" ] || "$FF" make-dataset audio "$F" --count 40 --min-seconds 10 --max-seconds 60 --rate 44100 --format flac --channels 1 --seed 1
cat "$W"/* "$F"/* > /dev/null   # warm the page cache

for r in $(seq 1 "$ROUNDS"); do
  for set in wav16k flac44k; do
    D="$OUT/audio-$set"
    "$VENV/bin/python" bench/audio_python.py "$D" --workers "$CPUS" --epochs "$EPOCHS" > "$OUT/audio_py_${set}_$r.json"
    "$FF" audio "$D" --workers "$CPUS" --epochs "$EPOCHS" --quiet --report-json "$OUT/audio_ff_${set}_$r.json" > /dev/null
  done
  echo "round $r done" >&2
done

"$VENV/bin/python" - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for s in ["wav16k", "flac44k"]:
    py = [json.load(open(f"{out}/audio_py_{s}_{r}.json")) for r in range(1, rounds + 1)]
    ff = [json.load(open(f"{out}/audio_ff_{s}_{r}.json")) for r in range(1, rounds + 1)]
    # The best epoch of each run: audio per epoch / that epoch's seconds.
    best_epoch = lambda x: max(x["audio_seconds"] / len(x["epochs"]) / e["seconds"] for e in x["epochs"])
    f = statistics.median(best_epoch(x) for x in ff)
    print(f"{s}: {py[0]['files']} files, {py[0]['audio_seconds']:.0f} s of audio, rounds {rounds}")
    allr = ", ".join("%.0f" % best_epoch(x) for x in ff)
    print(f"  ferrofeed audio      {f:9.0f} audio-s/s   (all rounds: {allr})")
    best = 0
    for k in ["librosa", "torchaudio", "dataloader"]:
        v = statistics.median(x[k] for x in py)
        best = max(best, v)
        print(f"  {k:<20} {v:9.0f} audio-s/s   ferrofeed = {f / v:.2f}x")
    print(f"  vs the best Python: {f / best:.2f}x")
PY
