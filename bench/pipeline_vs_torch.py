"""ferrofeed.Pipeline and DataLoader(native=True) against what they replace,
on the same ImageFolder (batch 64, 2 workers, train transform at 224):

  A. a Pipeline of native stages            vs ferrofeed.vision(transform="train")
  B. native decode + crop, then one Python   vs torch's DataLoader doing the same
     .map (a numpy augmentation that            decode, crop and augmentation
     releases the GIL)                          (torchvision + the same numpy code)
  C. DataLoader(ImageFolder(...), native=True) vs torch's DataLoader on that ImageFolder

Each contender runs in its own process, the contenders of a comparison in
turn, ROUNDS times; prints images/s (the best of EPOCHS epochs, median over
rounds), the ratio, and (C) the memory each adds over the process's own
`import torch, torchvision` (peak RSS summed over the process tree, worker
processes included, minus the RSS right after the imports).

    python bench/pipeline_vs_torch.py [--count 1024] [--rounds 3] [--epochs 2] [--only A,B,C]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from torch_loader import PeakRss, rss_tree  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def augment(x, gain):
    """The user's own augmentation, in numpy (its kernels release the GIL):
    a brightness gain and a clip, on a uint8 [3, H, W] image."""
    import numpy as np

    y = x.astype(np.float32)
    np.multiply(y, np.float32(gain), out=y)
    np.clip(y, 0, 255, out=y)
    return y


class TorchAugment:
    """The same augmentation as a torchvision transform (after PILToTensor)."""

    def __call__(self, t):
        import numpy as np
        import torch

        return torch.from_numpy(augment(t.numpy(), np.random.uniform(0.8, 1.2)))


def ff_map(sample, rng):
    sample["image"] = augment(sample["image"], rng.uniform(0.8, 1.2))
    return sample


def child(which, data, epochs, workers):
    import torch
    import torchvision  # noqa: F401  (the baseline both sides pay)
    from torchvision import datasets, transforms as T

    torch.set_num_threads(1)
    base = rss_tree(os.getpid())
    import ferrofeed as ff
    from ferrofeed.torch import DataLoader as FFDataLoader

    bs = 64
    if which == "vision":
        dl = ff.vision(data, transform="train", size=224, batch_size=bs, workers=workers, output="torch")
    elif which == "pipeline":
        dl = (ff.Pipeline(ff.source.image_folder(data), batch_size=bs, workers=workers, output="torch")
              .read().decode_image(transform="train", size=224).build())
    elif which == "pipeline_map":
        dl = (ff.Pipeline(ff.source.image_folder(data), batch_size=bs, workers=workers, output="torch")
              .read().decode_image(transform="train", size=224).map(ff_map, name="augment").build())
    elif which == "torch_map":
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor(), TorchAugment()])
        dl = torch.utils.data.DataLoader(datasets.ImageFolder(data, tf), batch_size=bs, shuffle=True,
                                         num_workers=workers, persistent_workers=True)
    else:
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
        ds = datasets.ImageFolder(data, tf)
        if which == "native":
            dl = FFDataLoader(ds, batch_size=bs, shuffle=True, num_workers=workers, native=True)
        else:
            dl = torch.utils.data.DataLoader(ds, batch_size=bs, shuffle=True, num_workers=workers,
                                             persistent_workers=True)
    rss = PeakRss()
    rates, gil = [], None
    for _ in range(epochs):
        t = time.perf_counter()
        n = 0
        for batch in dl:
            x = batch["images"] if isinstance(batch, dict) else batch[0]
            n += x.shape[0]
            float(x.reshape(-1)[0])  # touch it
        rates.append(n / (time.perf_counter() - t))
    if which == "pipeline_map":
        gil = dl.report()["python_stages"]
    print(json.dumps({"rates": rates, "added_bytes": rss.stop() - base, "gil": gil}))


COMPARISONS = {
    "A": ("vision", "pipeline", "a Pipeline of native stages against ferrofeed.vision(transform='train')"),
    "B": ("torch_map", "pipeline_map", "native decode+crop and a Python .map against torch's DataLoader"),
    "C": ("torch", "native", "DataLoader(ImageFolder, native=True) against torch's DataLoader"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default="A,B,C")
    ap.add_argument("--child", nargs=3, metavar=("WHICH", "DATA", "EPOCHS"))
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], int(a.child[2]), a.workers)
        return
    ff = os.path.join(ROOT, "target", "release", "ferrofeed")
    if not os.access(ff, os.X_OK):
        subprocess.run(["cargo", "build", "--release", "-q", "--bin", "ferrofeed"], cwd=ROOT, check=True)
    data = os.path.join(ROOT, "bench", "out", f"vision-{a.count}")
    if not os.path.isdir(data):
        subprocess.run([ff, "make-dataset", "vision", data, "--count", str(a.count), "--seed", "0"], check=True,
                       stdout=subprocess.DEVNULL)
    med = statistics.median
    for key in a.only.split(","):
        base, new, what = COMPARISONS[key]
        res = {base: [], new: []}
        for r in range(a.rounds):
            for which in (base, new):
                out = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--workers", str(a.workers), "--child", which, data,
                     str(a.epochs)],
                    check=True, capture_output=True, text=True,
                ).stdout
                res[which].append(json.loads(out.strip().splitlines()[-1]))
            print(f"{key} round {r + 1} done", file=sys.stderr)
        best = {k: [max(x["rates"]) for x in v] for k, v in res.items()}
        added = {k: [x["added_bytes"] for x in v] for k, v in res.items()}
        print(f"{key}: {what}; {a.rounds} rounds, {a.epochs} epochs, {a.workers} workers, batch 64 (medians)")
        for k in (base, new):
            print(f"  {k:13} {med(best[k]):7.0f} images/s  adds {med(added[k]) / 2**20:6.0f} MiB over import torch")
        ratios = [n / b for b, n in zip(best[base], best[new])]
        print(f"  {new} / {base}: {med(ratios):.2f}x (per round {[round(x, 2) for x in ratios]}); memory added "
              f"{med(added[new]) / max(med(added[base]), 1):.2f} of {base}'s")
        if key == "B":
            print(f"  GIL held by the Python stages (last round): {json.dumps(res[new][-1]['gil'])}")


if __name__ == "__main__":
    main()
