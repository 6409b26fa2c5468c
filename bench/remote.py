"""Remote data benchmark: 2,048 JPEGs as WebDataset shards (and as an
ImageFolder tree) on moto's S3 server on loopback, behind a proxy that
limits the link to 100 and 50 MB/s.

For each link rate it reports epoch 0 (downloads included) against
min(link rate, the local CPU-bound rate), later epochs (from the cache)
against the local rate, and for the tree the next-epoch prefetch on and off
with a cache that holds half the data. Not a timed test: figures drift with
load, so everything is measured in one run.

    python bench/remote.py [--count 2048] [--rounds 1]

Needs `pip install 'moto[server]' boto3` and a release build
(`cargo build --release`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))
from s3_servers import FaultProxy, Moto, s3_env  # noqa: E402

BIN = ROOT / "target" / "release" / "ferrofeed"


def run(args, env):
    r = subprocess.run([str(BIN), *map(str, args)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{args}: {r.stderr}")


def epochs(args, env, tmp, name):
    """Each epoch's images/s; epoch 0 counts from the start of the process
    (listing and the downloads made when the run opens included)."""
    rep = tmp / f"{name}.json"
    t = time.monotonic()
    run([*args, "--report-json", rep, "--quiet"], env)
    wall = time.monotonic() - t
    r = json.loads(rep.read_text())
    rates = [e["samples_per_s"] for e in r["epochs"]]
    first = wall - sum(e["seconds"] for e in r["epochs"][1:])
    rates[0] = r["epochs"][0]["samples"] / first
    return rates, r.get("remote", {})


def make_shards(src: Path, out: Path, per_shard: int) -> None:
    files = sorted(src.rglob("*.jpg"))
    classes = sorted({p.parent.name for p in files})
    out.mkdir(parents=True)
    for s in range(0, len(files), per_shard):
        with tarfile.open(out / f"shard-{s // per_shard:03}.tar", "w") as t:
            for i, p in enumerate(files[s : s + per_shard]):
                t.add(p, arcname=f"k{s + i:06}.jpg")
                cls = out / "cls.tmp"
                cls.write_text(str(classes.index(p.parent.name)))
                t.add(cls, arcname=f"k{s + i:06}.cls")
    (out / "cls.tmp").unlink()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "--bin", "ferrofeed"], cwd=ROOT, check=True)
    tmp = Path(tempfile.mkdtemp(prefix="ferrofeed-remote-bench-"))
    moto = Moto()
    try:
        tree = tmp / "tree"
        run(["make-dataset", "vision", tree, "--count", a.count], dict(os.environ))
        shards = tmp / "shards"
        make_shards(tree, shards, 128)
        total = moto.upload_tree("bench", "shards", shards)
        tree_bytes = moto.upload_tree("bench", "tree", tree)
        mean = total / a.count
        common = ["--epochs", "3", "--batch-size", "64"]
        print(f"{a.count} JPEGs, {total / 1e6:.1f} MB in {len(list(shards.iterdir()))} shards "
              f"({mean / 1e3:.1f} kB per image)")
        for rnd in range(a.rounds):
            local, _ = epochs(["vision", shards, *common], dict(os.environ), tmp, "local")
            print(f"round {rnd}: local shards: epoch 0 {local[0]:.0f} img/s, "
                  f"later {max(local[1:]):.0f} img/s")
            for rate in (100e6, 50e6):
                proxy = FaultProxy(moto.port)
                proxy.rate = rate
                env = s3_env(proxy.url)
                link = rate / mean
                cache = tmp / f"cache-{rnd}-{int(rate)}"
                got, rem = epochs(["vision", "s3://bench/shards", *common, "--remote-cache", cache],
                                  env, tmp, "remote")
                bound = min(link, local[0])
                print(f"  shards @ {rate / 1e6:.0f} MB/s: epoch 0 {got[0]:.0f} img/s = "
                      f"{got[0] / bound:.0%} of min(link {link:.0f}, local {local[0]:.0f}); "
                      f"later {max(got[1:]):.0f} = {max(got[1:]) / max(local[1:]):.0%} of local; "
                      f"{rem['bytes_downloaded'] / 1e6:.1f} MB downloaded "
                      f"at {rem['download_mb_per_s']:.1f} MB/s")
                for prefetch in ("true", "false"):
                    cache = tmp / f"tree-{rnd}-{int(rate)}-{prefetch}"
                    got, rem = epochs(
                        ["vision", "s3://bench/tree", *common, "--remote-cache", cache,
                         "--remote-cache-size", str(tree_bytes // 2), "--prefetch", prefetch],
                        env, tmp, "tree")
                    print(f"  tree @ {rate / 1e6:.0f} MB/s, cache = half, prefetch {prefetch}: "
                          f"epochs {', '.join(f'{x:.0f}' for x in got)} img/s; "
                          f"{rem['bytes_downloaded'] / 1e6:.1f} MB downloaded, "
                          f"{rem['download_workers']} download workers")
                proxy.stop()
    finally:
        moto.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
