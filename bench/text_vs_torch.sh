#!/usr/bin/env bash
# Text pipeline: tokens/s of `ferrofeed text` (cold token cache: tokenizing
# included; length-bucketed, padded) vs HF `tokenizers` batch encode of the
# same lines vs a PyTorch DataLoader (per-item tokenize, pad-to-longest
# collate), one worker per CPU, interleaved ROUNDS times; prints medians and
# ratios. Usage: bash bench/text_vs_torch.sh [CORPUS.txt] [ROUNDS]
# (default corpus: 1.5 MB of Python standard-library docstrings, no line
# repeated — bench/text_corpus.py — so that each contender works for a good
# fraction of a second and ferrofeed's word cache sees a real corpus's
# vocabulary, not the same lines again)
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=${1:-}
ROUNDS=${2:-3}
CPUS=$(nproc)
OUT=bench/out
VENV=${VENV:-bench/.venv}   # an existing venv with torch can be named here
TOK=domains/text/data/tokenizer.json
mkdir -p "$OUT"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import torch, tokenizers" 2>/dev/null; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch tokenizers numpy
fi
if [ -z "$CORPUS" ]; then
  CORPUS="$OUT/text-corpus-docstrings.txt"
  "$VENV/bin/python" bench/text_corpus.py 1500000 > "$CORPUS"
fi
cargo build --release -q --bin ferrofeed -p ferrofeed
FF=target/release/ferrofeed

for r in $(seq 1 "$ROUNDS"); do
  "$VENV/bin/python" bench/text_torch.py "$CORPUS" "$TOK" --workers "$CPUS" > "$OUT/text_py_$r.json"
  CACHE=$(mktemp -d)
  FERROFEED_CACHE_DIR=$CACHE "$FF" text "$CORPUS" --tokenizer "$TOK" --max-tokens 16384 \
    --workers "$CPUS" --quiet --report-json "$OUT/text_ff_$r.json" > /dev/null
  rm -rf "$CACHE"
  echo "round $r done" >&2
done

"$VENV/bin/python" - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
py = [json.load(open(f"{out}/text_py_{r}.json")) for r in range(1, rounds + 1)]
ff = [json.load(open(f"{out}/text_ff_{r}.json")) for r in range(1, rounds + 1)]
med = lambda xs: statistics.median(xs)
f = med([x["tokens_per_s"] for x in ff])
eb = med([x["encode_batch_tokens_per_s"] for x in py])
ebf = med([x["encode_batch_fast_tokens_per_s"] for x in py])
dl = med([x["dataloader_tokens_per_s"] for x in py])
print(f"lines {py[0]['lines']}, tokens {py[0]['tokens']} (ferrofeed: {ff[0]['tokens']}), rounds {rounds}")
print(f"ferrofeed text (cold cache)  {f/1e6:6.3f} M tokens/s   padding waste {ff[0]['padding_waste']*100:.1f}%")
print(f"tokenizers encode_batch      {eb/1e6:6.3f} M tokens/s   ferrofeed = {f/eb:.2f}x")
print(f"tokenizers encode_batch_fast {ebf/1e6:6.3f} M tokens/s   ferrofeed = {f/ebf:.2f}x")
print(f"PyTorch DataLoader           {dl/1e6:6.3f} M tokens/s   ferrofeed = {f/dl:.2f}x")
PY
