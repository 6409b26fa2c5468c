#!/usr/bin/env bash
# Audio pipeline: audio-seconds per second of decode (+ resample to 16 kHz)
# + 80-band log-mel for `ferrofeed audio` vs librosa, torchaudio and a
# 2-worker PyTorch DataLoader on the same files, in the same run, for two
# inputs: 40 files of 10–60 s as 16 kHz WAV and as 44.1 kHz FLAC.
# Every contender makes EPOCHS passes over the files and its best pass counts
# (a ferrofeed pass lasts ~0.1 s here: one pass alone measures start-up and
# the machine's noise more than the pipeline). ferrofeed also runs with
# `--feature-cache` from an empty cache (epoch 0 fills it, later epochs read
# it: the later-epoch figure against the best Python contender), and once
# with one worker for one epoch, whose CPU time per audio second sets the
# first epoch's ideal rate (CPUS × one worker's stages run in turn).
# Rounds are interleaved; medians and ratios are printed.
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
    # With the feature cache, from empty: epoch 0 decodes and fills it,
    # later epochs read it.
    rm -rf "$OUT/fcache-$set"
    "$FF" audio "$D" --workers "$CPUS" --epochs "$EPOCHS" --feature-cache "$OUT/fcache-$set" --quiet \
      --report-json "$OUT/audio_ffc_${set}_$r.json" > /dev/null
    # One worker, one epoch: the CPU seconds per audio second of the stages
    # run one after another (the first epoch's pipeline efficiency is the
    # measured rate over CPUS × this).
    # (User and system seconds from wait4, to the microsecond: /usr/bin/time
    # prints hundredths, ±4% of this ~0.25 s run.)
    "$VENV/bin/python" - "$OUT/audio_ff1_${set}_$r.time" "$FF" audio "$D" --workers 1 --epochs 1 \
      --quiet --report-json "$OUT/audio_ff1_${set}_$r.json" <<'PY'
import os, subprocess, sys
p = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL)
_, status, ru = os.wait4(p.pid, 0)
open(sys.argv[1], "w").write(f"{ru.ru_utime:.6f} {ru.ru_stime:.6f}\n")
sys.exit(os.waitstatus_to_exitcode(status))
PY
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
    # The feature cache: epoch 0 fills it, epochs 1.. read it.
    ffc = [json.load(open(f"{out}/audio_ffc_{s}_{r}.json")) for r in range(1, rounds + 1)]
    rate = lambda x, e: x["audio_seconds"] / len(x["epochs"]) / e["seconds"]
    c0 = statistics.median(rate(x, x["epochs"][0]) for x in ffc)
    cl = statistics.median(max(rate(x, e) for e in x["epochs"][1:]) for x in ffc)
    print(f"  ferrofeed + feature cache: epoch 0 {c0:9.0f} audio-s/s, best later {cl:9.0f} audio-s/s"
          f" = {cl / best:.1f}x the best Python (target 10x)")
    # First-epoch efficiency: measured epoch-0 rate (no cache) against
    # CPUS × the one-worker run's audio seconds per CPU second.
    one = []
    for r in range(1, rounds + 1):
        u, sy = map(float, open(f"{out}/audio_ff1_{s}_{r}.time").read().split()[-2:])
        one.append(json.load(open(f"{out}/audio_ff1_{s}_{r}.json"))["audio_seconds"] / (u + sy))
    cpus = len(__import__("os").sched_getaffinity(0))
    e0 = statistics.median(rate(x, x["epochs"][0]) for x in ff)
    ideal = cpus * statistics.median(one)
    print(f"  first epoch {e0:9.0f} audio-s/s against {cpus} CPUs x {statistics.median(one):.0f} audio-s per CPU-s"
          f" (one worker, stages in turn) = {ideal:.0f}: efficiency {e0 / ideal:.0%} (target 90%)")
PY
