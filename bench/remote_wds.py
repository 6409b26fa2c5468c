"""The Python peer of bench/remote.py: webdataset 1.0 reading the same
WebDataset shards over HTTP from the same server (through the same
bandwidth-limited proxy), with its shard cache on local disk, decoding and
augmenting as `ferrofeed vision` does: PIL decode, RandomResizedCrop(224)
(torchvision's sampling: scale 0.08-1, ratio 3/4-4/3, ten tries, then a
centre crop), a horizontal flip, uint8 CHW tensors; a PyTorch DataLoader
with persistent workers, batch 64. Prints one JSON line: images/s of each
epoch (epoch 0 from the loader's first `iter`, imports not counted).

    python bench/remote_wds.py URL [URL ...] --cache DIR [--workers 2] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time

import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader


def crop_box(w: int, h: int, rng: random.Random) -> tuple[int, int, int, int]:
    area = w * h
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw = int(round(math.sqrt(target * ratio)))
        ch = int(round(math.sqrt(target / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            x = rng.randint(0, w - cw)
            y = rng.randint(0, h - ch)
            return x, y, x + cw, y + ch
    # Centre crop at the nearest allowed ratio.
    r = w / h
    if r < 3 / 4:
        cw, ch = w, int(round(w / (3 / 4)))
    elif r > 4 / 3:
        cw, ch = int(round(h * (4 / 3))), h
    else:
        cw, ch = w, h
    x, y = (w - cw) // 2, (h - ch) // 2
    return x, y, x + cw, y + ch


_rng = random.Random()


def transform(img: Image.Image) -> torch.Tensor:
    img = img.convert("RGB")
    box = crop_box(img.width, img.height, _rng)
    out = img.resize((224, 224), Image.BILINEAR, box=box)
    if _rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    t = torch.frombuffer(bytearray(out.tobytes()), dtype=torch.uint8)
    return t.view(224, 224, 3).permute(2, 0, 1).contiguous()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("urls", nargs="+")
    ap.add_argument("--cache", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.cache, exist_ok=True)
    ds = (
        wds.WebDataset(a.urls, cache_dir=a.cache, shardshuffle=len(a.urls), empty_check=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(transform, int)
    )
    dl = DataLoader(ds, batch_size=a.batch_size, num_workers=a.workers, persistent_workers=True)
    rates = []
    for _ in range(a.epochs):
        t = time.perf_counter()
        n = 0
        for images, _labels in dl:
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, 224, 224)
            n += images.shape[0]
        rates.append(n / (time.perf_counter() - t))
    print(json.dumps({"images_per_s": rates}))


if __name__ == "__main__":
    main()
