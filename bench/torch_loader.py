"""PyTorch DataLoader baseline for bench/vision_vs_torch.sh.

ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor,
batch 64, persistent workers. Prints one JSON line: images/s of each epoch
and the peak summed RSS of this process and its workers.
"""
import argparse
import json
import os
import threading
import time

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def rss_tree(pid):
    """Resident bytes of pid and all its descendants."""
    total = 0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


class PeakRss:
    """Samples `rss_tree` of this process every 50 ms on a thread until
    `stop()`; `peak` is the largest seen."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_tree(os.getpid()))
            time.sleep(0.05)

    def stop(self):
        self._stop.set()
        return self.peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(1)
    tf = transforms.Compose(
        [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
    )
    ds = datasets.ImageFolder(a.data, transform=tf)
    dl = DataLoader(
        ds,
        batch_size=a.batch_size,
        shuffle=True,
        num_workers=a.workers,
        persistent_workers=a.workers > 0,
    )
    rss = PeakRss()
    rates = []
    for _ in range(a.epochs):
        t = time.perf_counter()
        n = 0
        for images, labels in dl:
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, 224, 224)
            n += images.shape[0]
        rates.append(n / (time.perf_counter() - t))
    print(json.dumps({"images_per_s": rates, "peak_rss_bytes": rss.stop()}))


if __name__ == "__main__":
    main()
