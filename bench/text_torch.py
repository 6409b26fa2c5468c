"""Python side of bench/text_vs_torch.sh: tokens/s of HF `tokenizers` batch
encode and of a PyTorch DataLoader (per-item tokenize, pad-to-longest
collate) on the same lines. Prints one JSON object.

  python bench/text_torch.py CORPUS.txt TOKENIZER.json [--workers 2] [--max-length 512]
"""
import argparse
import json
import os
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import tokenizers
import torch
from torch.utils.data import DataLoader, Dataset

ap = argparse.ArgumentParser()
ap.add_argument("corpus")
ap.add_argument("tokenizer")
ap.add_argument("--workers", type=int, default=2)
ap.add_argument("--max-length", type=int, default=512)
ap.add_argument("--batch-size", type=int, default=64)
a = ap.parse_args()

with open(a.corpus, encoding="utf-8") as f:
    lines = [l.rstrip("\n") for l in f if l.strip()]


def load():
    t = tokenizers.Tokenizer.from_file(a.tokenizer)
    t.no_padding()
    t.enable_truncation(max_length=a.max_length)
    return t


tok = load()
out = {"lines": len(lines)}
t0 = time.perf_counter()
encs = tok.encode_batch(lines)
dt = time.perf_counter() - t0
tokens = sum(len(e.ids) for e in encs)
out["tokens"] = tokens
out["encode_batch_tokens_per_s"] = tokens / dt
t0 = time.perf_counter()
encs = tok.encode_batch_fast(lines)
out["encode_batch_fast_tokens_per_s"] = tokens / (time.perf_counter() - t0)


class Lines(Dataset):
    def __init__(self):
        self.tok = None

    def __len__(self):
        return len(lines)

    def __getitem__(self, i):
        if self.tok is None:
            self.tok = load()
        return torch.tensor(self.tok.encode(lines[i]).ids, dtype=torch.int64)


def pad(batch):
    n = max(len(x) for x in batch)
    ids = torch.zeros(len(batch), n, dtype=torch.int64)
    mask = torch.zeros(len(batch), n, dtype=torch.int64)
    for r, x in enumerate(batch):
        ids[r, : len(x)] = x
        mask[r, : len(x)] = 1
    return ids, mask


os.environ["TOKENIZERS_PARALLELISM"] = "false"
t0 = time.perf_counter()
loader = DataLoader(Lines(), batch_size=a.batch_size, shuffle=True, num_workers=a.workers, collate_fn=pad)
got = 0
for ids, mask in loader:
    got += int(mask.sum())
dt = time.perf_counter() - t0
assert got == tokens, (got, tokens)
out["dataloader_tokens_per_s"] = tokens / dt
print(json.dumps(out))
