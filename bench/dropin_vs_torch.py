"""ferrofeed.torch.DataLoader (threads) against torch.utils.data.DataLoader
(processes) on the same Dataset code: a torchvision ImageFolder with
RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor, batch 64,
2 workers, and a dataset doing numpy work per sample. Each contender runs in
its own process, interleaved, ROUNDS times; prints images/s (best epoch,
median over rounds) and peak RSS summed over the process tree.

    python bench/dropin_vs_torch.py [--count 2048] [--rounds 3] [--epochs 2] [--profile]

`--profile` adds a py-spy-free look at where the drop-in's time goes: the
share of each epoch the consumer waited (data stall) and the time in
`__getitem__` and collate summed over workers, from `loader.report()`.
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
from torch_loader import PeakRss  # noqa: E402  (the same tree sum as the torch baseline)


class NumpyWork:
    """A map-style dataset whose samples cost numpy kernels (an FFT and a
    matrix product), which release the GIL."""

    def __init__(self, n=2048):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import numpy as np

        rng = np.random.default_rng(i)
        x = rng.standard_normal((256, 256)).astype(np.float32)
        y = np.abs(np.fft.rfft2(x)).astype(np.float32)
        return (y[:, :128] @ y[:128, :128]).astype(np.float32)


def child(which, kind, data, epochs, workers):
    import torch

    torch.set_num_threads(1)
    if which == "ferrofeed":
        from ferrofeed.torch import DataLoader
    else:
        from torch.utils.data import DataLoader
    if kind == "vision":
        from torchvision import datasets, transforms

        tf = transforms.Compose(
            [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
        )
        ds = datasets.ImageFolder(data, transform=tf)
    else:
        ds = NumpyWork(int(data))
    dl = DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    rss = PeakRss()
    rates, reports = [], []
    for _ in range(epochs):
        t = time.perf_counter()
        n = 0
        for batch in dl:
            x = batch[0] if isinstance(batch, (list, tuple)) else batch
            n += x.shape[0]
            int(x.reshape(-1)[0])  # touch it
        rates.append(n / (time.perf_counter() - t))
        if which == "ferrofeed":
            reports.append({k: v for k, v in dl.report().items() if k.endswith("seconds")})
    print(json.dumps({"rates": rates, "peak_rss_bytes": rss.stop(), "reports": reports}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--child", nargs=4, metavar=("WHICH", "KIND", "DATA", "EPOCHS"))
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], a.child[2], int(a.child[3]), a.workers)
        return
    ff = os.path.join(ROOT, "target", "release", "ferrofeed")
    if not os.access(ff, os.X_OK):
        subprocess.run(["cargo", "build", "--release", "-q", "--bin", "ferrofeed"], cwd=ROOT, check=True)
    data = os.path.join(ROOT, "bench", "out", f"vision-{a.count}")
    if not os.path.isdir(data):
        subprocess.run([ff, "make-dataset", "vision", data, "--count", str(a.count), "--seed", "0"], check=True,
                       stdout=subprocess.DEVNULL)
    med = statistics.median
    for kind, arg in [("vision", data), ("numpy", str(a.count))]:
        res = {"torch": [], "ferrofeed": []}
        for r in range(a.rounds):
            for which in ("torch", "ferrofeed"):
                out = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--workers", str(a.workers), "--child", which, kind,
                     arg, str(a.epochs)],
                    check=True, capture_output=True, text=True,
                ).stdout
                res[which].append(json.loads(out))
            print(f"{kind} round {r + 1} done", file=sys.stderr)
        best = {k: [max(x["rates"]) for x in v] for k, v in res.items()}
        rss = {k: [x["peak_rss_bytes"] for x in v] for k, v in res.items()}
        unit = "images/s" if kind == "vision" else "samples/s"
        print(f"{kind}: {a.rounds} rounds, {a.epochs} epochs, {a.workers} workers, batch 64 (medians)")
        for k in ("torch", "ferrofeed"):
            print(f"  {k:10} {med(best[k]):8.0f} {unit}  peak RSS {med(rss[k]) / 2**20:6.0f} MiB")
        ratios = [f / t for t, f in zip(best["torch"], best["ferrofeed"])]
        print(f"  ferrofeed / torch: {med(ratios):.2f}x speed (per round {[round(x, 2) for x in ratios]}), "
              f"memory 1/{med(rss['torch']) / med(rss['ferrofeed']):.1f}")
        if a.profile:
            last = res["ferrofeed"][-1]["reports"][-1]
            print(f"  drop-in, last epoch: {json.dumps(last)}")


if __name__ == "__main__":
    main()
