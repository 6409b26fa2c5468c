"""The training-loop view from Python: ferrofeed's package vs PyTorch's
DataLoader (and vs the `ferrofeed` command, to show what the binding costs),
on the data and work of bench/vision_vs_torch.sh: decode +
RandomResizedCrop(224) + horizontal flip, uint8 CHW, batch 64, one worker per
CPU. Each contender runs in its own process, interleaved, ROUNDS times; a
Python loop takes every batch and touches it. Prints the first and the best
later epoch (median over rounds), peak RSS (summed over DataLoader's worker
processes), and the ratios. Then text and audio from Python against the
command (one round each; the binding's cost there).

    python bench/python_vs_torch.py [--count 2048] [--rounds 3] [--epochs 3]

Needs torch, torchvision and the installed `ferrofeed` package
(`pip install ./python`), and the release binary (built here if missing).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FF = os.path.join(ROOT, "target", "release", "ferrofeed")


def peak_rss_self():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(domain, data, epochs, cpus):
    """One ferrofeed loader in this process: each epoch's rate, peak RSS."""
    import ferrofeed

    data = None if data == "-" else data
    if domain == "vision":
        loader = ferrofeed.vision(data, batch_size=64, workers=cpus, transform="train", epochs=epochs)
        key, unit = "images", lambda b: b["images"].shape[0]
    elif domain == "text":
        loader = ferrofeed.text(data, batch_size=64, workers=cpus, epochs=epochs)
        key, unit = "input_ids", lambda b: int(b["attention_mask"].sum())
    else:
        loader = ferrofeed.audio(data, batch_size=16, workers=cpus, epochs=epochs)
        key, unit = "features", lambda b: b["features"].shape[0]
    rates = []
    for _ in range(epochs):
        t = time.perf_counter()
        n = 0
        for batch in loader:
            x = batch[key]
            n += unit(batch)
            int(x[-1].reshape(-1)[0])  # touch the batch
        rates.append(n / (time.perf_counter() - t))
    print(json.dumps({"rates": rates, "peak_rss_bytes": peak_rss_self()}))


def run(cmd):
    """Runs `cmd`; returns its stdout and its peak RSS (bytes)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    if status != 0:
        raise SystemExit(f"{cmd[:3]} failed ({status})")
    return out, usage.ru_maxrss * 1024


def command_rates(report):
    r = json.load(open(report))
    return [e["samples_per_s"] for e in r["epochs"]], r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--child", nargs=3, metavar=("DOMAIN", "DATA", "EPOCHS"))
    a = ap.parse_args()
    cpus = len(os.sched_getaffinity(0))
    if a.child:
        child(a.child[0], a.child[1], int(a.child[2]), cpus)
        return
    if not os.access(FF, os.X_OK):
        subprocess.run(["cargo", "build", "--release", "-q", "--bin", "ferrofeed"], cwd=ROOT, check=True)
    out = os.path.join(ROOT, "bench", "out")
    os.makedirs(out, exist_ok=True)
    data = os.path.join(out, f"vision-{a.count}")
    if not os.path.isdir(data):
        subprocess.run([FF, "make-dataset", "vision", data, "--count", str(a.count), "--seed", "0"], check=True,
                       stdout=subprocess.DEVNULL)
    py = sys.executable
    me = os.path.abspath(__file__)
    rows = {"torch": [], "package": [], "command": []}
    for r in range(a.rounds):
        o, _ = run([py, os.path.join(ROOT, "bench", "torch_loader.py"), data, "--workers", str(cpus),
                    "--epochs", str(a.epochs)])
        t = json.loads(o)
        rows["torch"].append((t["images_per_s"], t["peak_rss_bytes"]))
        o, rss = run([py, me, "--child", "vision", data, str(a.epochs)])
        rows["package"].append((json.loads(o)["rates"], rss))
        rep = os.path.join(out, f"py_cmd_{r}.json")
        _, rss = run([FF, "vision", data, "--workers", str(cpus), "--epochs", str(a.epochs), "--batch-size", "64",
                      "--quiet", "--report-json", rep])
        rows["command"].append((command_rates(rep)[0], rss))
        print(f"round {r + 1} done", file=sys.stderr)
    med = statistics.median
    mib = lambda b: b / 2**20
    first = {k: [v[0][0] for v in rs] for k, rs in rows.items()}
    best = {k: [max(v[0][1:]) for v in rs] for k, rs in rows.items()}
    rss = {k: [v[1] for v in rs] for k, rs in rows.items()}
    print(f"vision, {a.count} images, {a.epochs} epochs, {a.rounds} rounds, {cpus} CPUs (images/s, medians)")
    print(f"{'':22} {'first epoch':>12} {'best later':>12} {'peak RSS':>10}")
    for k, name in [("torch", "PyTorch DataLoader"), ("package", "ferrofeed (Python)"), ("command", "ferrofeed command")]:
        print(f"{name:22} {med(first[k]):12.0f} {med(best[k]):12.0f} {mib(med(rss[k])):7.0f} MiB")
    ratio = lambda x, y: med([b / a for a, b in zip(x, y)])
    print(f"package / PyTorch: first {ratio(first['torch'], first['package']):.2f}x, "
          f"later {ratio(best['torch'], best['package']):.2f}x, memory 1/{med(rss['torch']) / med(rss['package']):.1f}")
    print(f"package / command: first {ratio(first['command'], first['package']):.3f}, "
          f"later {ratio(best['command'], best['package']):.3f} (median of per-round ratios)")
    print("per round (torch, package, command) best later:",
          [(round(x), round(y), round(z)) for x, y, z in zip(best["torch"], best["package"], best["command"])])

    # Text and audio: the package against the command, on the embedded datasets.
    for domain, unit in [("text", "tokens/s"), ("audio", "chunks/s")]:
        rep = os.path.join(out, f"py_cmd_{domain}.json")
        args = [FF, domain, "--workers", str(cpus), "--epochs", "2", "--quiet", "--report-json", rep]
        args += ["--batch-size", "64" if domain == "text" else "16"]
        _, crss = run(args)
        cr, report = command_rates(rep)
        o, prss = run([py, me, "--child", domain, "-", "2"])
        pr = json.loads(o)["rates"]
        if domain == "text":
            # The command's epochs are in sequences/s; the child counts tokens.
            per_seq = report["tokens"] / max(report["samples"], 1)
            cr = [x * per_seq for x in cr]
        print(f"{domain}: package {pr[-1]:.0f} vs command {cr[-1]:.0f} {unit} (second epoch), "
              f"ratio {pr[-1] / cr[-1]:.3f}; peak RSS {mib(prss):.0f} vs {mib(crss):.0f} MiB")


if __name__ == "__main__":
    main()
