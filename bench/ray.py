"""The vision workload three ways, on the same cores and data as
bench/vision_vs_torch.sh (decode + RandomResizedCrop(224) + horizontal flip,
uint8 CHW, batch 64):

  (a) native   ferrofeed.vision in one process, one worker per CPU
  (b) ray-ff   ferrofeed.ray.read on a local Ray cluster of all CPUs
  (c) ray-tv   what a Ray user writes today: ray.data.read_images +
               map_batches with torchvision's RandomResizedCrop and flip

Each contender runs in its own process, interleaved, ROUNDS times; the
consumer takes every batch and touches it. Prints images/s of the first and
the best later epoch (median over rounds), the Ray start-up, the peak RSS
summed over the process and all its descendants (Ray's raylet, object store
and workers included), and the ratios: targets (b) >= 3x (c) and (b) within
25% of (a).

    bash bench/ray.sh [--count 2048] [--rounds 3] [--epochs 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# This file is named ray.py: keep its folder off the path so that
# `import ray` finds Ray.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]


def tree_rss(pid):
    """RSS of ``pid`` and every descendant, from /proc."""
    children = {}
    rss = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{p}/statm") as f:
                rss[int(p)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(p))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += children.get(p, [])
    return total


class PeakRss:
    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(os.getpid()))
            self._stop.wait(0.25)

    def stop(self):
        self._stop.set()
        self._t.join()
        return self.peak


def touch(images):
    int(images[-1].reshape(-1)[0])


def run_native(data, epochs, cpus):
    import ferrofeed

    loader = ferrofeed.vision(data, batch_size=64, workers=cpus, transform="train", seed=0,
                              drop_last=False, output="numpy", quiet=True)
    rates = []
    for e in range(epochs):
        t = time.perf_counter()
        n = 0
        for b in loader.epoch(e):
            touch(b["images"])
            n += len(b["indices"])
        rates.append(n / (time.perf_counter() - t))
    return rates, 0.0


def start_ray(cpus):
    import ray

    t = time.perf_counter()
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    # Ray Data reserves part of the cluster for each operator's downstream;
    # on a small machine that leaves a single read task running at a time.
    ctx.op_resource_reservation_enabled = os.environ.get("BENCH_RAY_RESERVATION", "on") == "on"
    return ray, time.perf_counter() - t


def run_ray_ff(data, epochs, cpus):
    ray, startup = start_ray(cpus)
    import ferrofeed.ray

    rates = []
    for e in range(epochs):
        t = time.perf_counter()
        ds = ferrofeed.ray.read("vision", data, epoch=e, batch_size=64, transform="train", seed=0,
                                **json.loads(os.environ.get("BENCH_FF_OPTIONS", "{}")))
        n = 0
        for b in ds.iter_batches(batch_size=64, batch_format="numpy"):
            touch(b["images"])
            n += len(b["indices"])
        rates.append(n / (time.perf_counter() - t))
    ray.shutdown()
    return rates, startup


def _torchvision_train(batch, classes):
    """RandomResizedCrop(224) + horizontal flip on decoded HWC uint8 rows,
    out as uint8 CHW, the class from the parent folder (a plain function, so
    Ray fuses it with the read into one task per block)."""
    import numpy as np
    import torch
    from torchvision.transforms import v2

    torch.set_num_threads(1)
    t = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
    out = np.empty((len(batch["image"]), 3, 224, 224), dtype=np.uint8)
    for i, img in enumerate(batch["image"]):
        out[i] = t(torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)).numpy()
    labels = np.array([classes[os.path.basename(os.path.dirname(p))] for p in batch["path"]], dtype=np.int64)
    return {"images": out, "labels": labels}


def run_ray_tv(data, epochs, cpus):
    ray, startup = start_ray(cpus)
    classes = {c: i for i, c in enumerate(sorted(os.listdir(data)))}
    rates = []
    for e in range(epochs):
        t = time.perf_counter()
        ds = ray.data.read_images(data, include_paths=True, mode="RGB")
        ds = ds.map_batches(_torchvision_train, fn_kwargs={"classes": classes}, batch_size=64,
                            batch_format="numpy")
        n = 0
        for b in ds.iter_batches(batch_size=64, batch_format="numpy"):
            touch(b["images"])
            n += len(b["labels"])
        rates.append(n / (time.perf_counter() - t))
    ray.shutdown()
    return rates, startup


CONTENDERS = {"native": run_native, "ray-ff": run_ray_ff, "ray-tv": run_ray_tv}


def child(name, data, epochs, cpus):
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    peak = PeakRss()
    rates, startup = CONTENDERS[name](data, epochs, cpus)
    print(json.dumps({"rates": rates, "startup_s": startup, "peak_rss_bytes": peak.stop()}))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--reservation", choices=("on", "off"), default="on",
                   help="Ray Data's per-operator resource reservation (DataContext.op_resource_reservation_enabled)")
    p.add_argument("--ff-options", default="{}",
                   help='extra options for ray-ff as JSON, e.g. \'{"scan_index": 0}\'')
    p.add_argument("--only", default=",".join(CONTENDERS), help="contenders to run, comma-separated")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    a = p.parse_args()
    cpus = os.cpu_count() or 1
    os.environ["BENCH_RAY_RESERVATION"] = a.reservation
    os.environ["BENCH_FF_OPTIONS"] = a.ff_options
    if a.child:
        child(a.child, a.data, a.epochs, cpus)
        return
    ff = os.path.join(ROOT, "target", "release", "ferrofeed")
    data = os.path.join(ROOT, "bench", "out", f"vision-{a.count}")
    if not os.path.isdir(data):
        subprocess.run([ff, "make-dataset", "vision", data, "--count", str(a.count), "--seed", "0"], check=True)
    results = {k: [] for k in a.only.split(",")}
    for r in range(a.rounds):
        for name in results:
            out = subprocess.run(
                [sys.executable, __file__, "--child", name, "--data", data, "--epochs", str(a.epochs)],
                capture_output=True, text=True, check=True,
            ).stdout
            results[name].append(json.loads(out.strip().splitlines()[-1]))
        print(f"round {r + 1} done", file=sys.stderr)
    med = {}
    print(f"{a.count} JPEGs, {cpus} CPUs, {a.rounds} rounds, {a.epochs} epochs, Ray Data reservation {a.reservation}, "
          f"ray-ff options {a.ff_options}; "
          "images/s (median over rounds)")
    print(f"{'':8} {'epoch 0':>9} {'best later':>11} {'ray start s':>12} {'peak RSS MiB':>13}")
    for name, rs in results.items():
        first = statistics.median(x["rates"][0] for x in rs)
        later = statistics.median(max(x["rates"][1:]) for x in rs) if a.epochs > 1 else first
        start = statistics.median(x["startup_s"] for x in rs)
        rss = statistics.median(x["peak_rss_bytes"] for x in rs) / 2**20
        med[name] = (first, later)
        print(f"{name:8} {first:9.0f} {later:11.0f} {start:12.2f} {rss:13.0f}")
    for i, label in ((0, "epoch 0"), (1, "later")):
        if not {"ray-ff", "ray-tv", "native"} <= set(med):
            break
        b, c, n = med["ray-ff"][i], med["ray-tv"][i], med["native"][i]
        print(f"{label}: ray-ff / ray-tv = {b / c:.2f}x (target >= 3), ray-ff / native = {b / n:.2f} (target >= 0.75)")


if __name__ == "__main__":
    main()
