#!/usr/bin/env bash
# Vision input pipeline: ferrofeed vs PyTorch's DataLoader on the same data
# and the same CPU work (decode + RandomResizedCrop(224) + horizontal flip,
# uint8 CHW, batch 64, one worker per CPU), plus the plain decode limit.
# Runs the contenders interleaved, ROUNDS times, and prints medians, ratios
# and peak RSS. Usage: bash bench/vision_vs_torch.sh [COUNT] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-2048}
ROUNDS=${2:-3}
CPUS=$(nproc)
OUT=bench/out
VENV=${VENV:-bench/.venv}   # an existing venv with torch can be named here
mkdir -p "$OUT"

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch torchvision pillow numpy
fi
command -v /usr/bin/time >/dev/null || apt-get install -y -qq time

cargo build --release -q --bin ferrofeed -p ferrofeed
cargo build --release -q -p ferrofeed-vision --example decode_speed
FF=target/release/ferrofeed
DATA="$OUT/vision-$COUNT"
[ -d "$DATA" ] || "$FF" make-dataset vision "$DATA" --count "$COUNT" --seed 0
cat "$DATA"/*/*.jpg > /dev/null   # warm the page cache

maxrss() { grep "Maximum resident" "$1" | awk '{print $6 * 1024}'; }
for r in $(seq 1 "$ROUNDS"); do
  /usr/bin/time -v "$VENV/bin/python" bench/torch_loader.py "$DATA" --workers "$CPUS" --epochs 2 \
    > "$OUT/torch_$r.json" 2> "$OUT/torch_$r.time"
  /usr/bin/time -v "$FF" vision "$DATA" --workers "$CPUS" --epochs 2 --batch-size 64 --quiet \
    --report-json "$OUT/ff_$r.json" > /dev/null 2> "$OUT/ff_$r.time"
  target/release/examples/decode_speed "$DATA" zune > "$OUT/decode_$r.txt"
  echo "round $r done" >&2
done

"$VENV/bin/python" - "$OUT" "$ROUNDS" "$CPUS" <<'PY'
import json, re, statistics, sys
out, rounds, cpus = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def maxrss(path):
    for line in open(path):
        if "Maximum resident" in line:
            return int(line.split()[-1]) * 1024
torch, torch_rss, ff, ff_rss, dec, ff_first = [], [], [], [], [], []
for r in range(1, rounds + 1):
    t = json.load(open(f"{out}/torch_{r}.json"))
    torch.append(max(t["images_per_s"]))          # its best (steady-state) epoch
    torch_rss.append(t["peak_rss_bytes"])         # summed over the worker processes
    f = json.load(open(f"{out}/ff_{r}.json"))
    ff.append(max(e["samples_per_s"] for e in f["epochs"]))  # its best epoch, as for torch
    ff_first.append(f["epochs"][0]["samples_per_s"])
    ff_rss.append(maxrss(f"{out}/ff_{r}.time"))
    ms = float(re.search(r"zune-jpeg decode only: ([0-9.]+) ms", open(f"{out}/decode_{r}.txt").read()).group(1))
    dec.append(1000.0 / ms * cpus)
med = statistics.median
mib = lambda b: b / 2**20
print(f"rounds: {rounds}, CPUs: {cpus}")
print(f"PyTorch DataLoader      {med(torch):8.0f} images/s   peak RSS {mib(med(torch_rss)):7.0f} MiB (summed over processes)")
print(f"ferrofeed vision        {med(ff):8.0f} images/s   peak RSS {mib(med(ff_rss)):7.0f} MiB")
print(f"  its first epoch       {med(ff_first):8.0f} images/s   (the scan index fills; later epochs use it)")
print(f"plain decode limit      {med(dec):8.0f} images/s   (zune-jpeg decode only, 1 thread x {cpus})")
print(f"ferrofeed / PyTorch     {med(ff) / med(torch):8.2f}x")
print(f"ferrofeed / decode limit{med(ff) / med(dec):8.2f}x")
# Contenders of one round run back to back, so per-round ratios shift less
# with the machine's load than ratios of medians taken across rounds.
print(f"median of per-round ratios: {med([b / a for a, b in zip(torch, ff)]):.2f}x PyTorch, "
      f"{med([b / c for b, c in zip(ff, dec)]):.2f}x decode limit")
print("per round (torch, ferrofeed, decode limit):", [(round(a), round(b), round(c)) for a, b, c in zip(torch, ff, dec)])
PY
