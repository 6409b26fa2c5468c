"""Remote data benchmark: 2,048 JPEGs as WebDataset shards (and as an
ImageFolder tree) on moto's S3 server on loopback, behind a proxy that
limits the link to 100 and 50 MB/s.

For each link rate it reports epoch 0 (downloads included) against
min(link rate, the local CPU-bound rate), later epochs (from the cache)
against the local rate, and for the tree the next-epoch prefetch on and off
with a cache that holds half the data; and side by side webdataset
(bench/remote_wds.py, with its shard cache) reading the same shards from the
same server through the same proxy. Not a timed test: figures drift with
load, so everything is measured in one run.

    python bench/remote.py [--count 2048] [--rounds 1] [--shards-only]

(`PEER_PYTHON` names another interpreter for the webdataset peer.)

Needs `pip install 'moto[server]' boto3 webdataset torch pillow` and a release build
(`cargo build --release`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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


def cpu_seconds(pid=None):
    """CPU seconds (user + system) of process `pid`, or of this process
    (where the proxy's threads run)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def epochs(args, env, tmp, name, server_pid=None):
    """Each epoch's images/s; epoch 0 counts from the start of the process
    (listing and the downloads made when the run opens included). The
    remote fields gain `cpu_s`, the command's CPU seconds, and `server_cpu_s`,
    what the proxy (this process) and the server (`server_pid`) spent
    meanwhile."""
    rep = tmp / f"{name}.json"
    c0 = os.times()
    s0 = cpu_seconds() + (cpu_seconds(server_pid) if server_pid else 0.0)
    t = time.monotonic()
    run([*args, "--report-json", rep, "--quiet"], env)
    wall = time.monotonic() - t
    c1 = os.times()
    s1 = cpu_seconds() + (cpu_seconds(server_pid) if server_pid else 0.0)
    r = json.loads(rep.read_text())
    rates = [e["samples_per_s"] for e in r["epochs"]]
    first = wall - sum(e["seconds"] for e in r["epochs"][1:])
    rates[0] = r["epochs"][0]["samples"] / first
    rem = dict(r.get("remote", {}))
    rem["cpu_s"] = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
    rem["server_cpu_s"] = s1 - s0
    return rates, rem


def presign(moto: Moto, proxy: FaultProxy, key: str) -> str:
    """A presigned GET of `bench/key` through the proxy (the query-string
    signature does not cover the host), for a reader without S3 credentials."""
    url = moto.client().generate_presigned_url(
        "get_object", Params={"Bucket": "bench", "Key": key}, ExpiresIn=3600)
    return url.replace(f"127.0.0.1:{moto.port}", f"127.0.0.1:{proxy.port}", 1)


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
    ap.add_argument("--shards-only", action="store_true", help="skip the ImageFolder tree runs")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "--bin", "ferrofeed"], cwd=ROOT, check=True)
    tmp = Path(tempfile.mkdtemp(prefix="ferrofeed-remote-bench-"))
    moto = Moto()
    try:
        tree = tmp / "tree"
        run(["make-dataset", "vision", tree, "--count", a.count], dict(os.environ))
        shards = tmp / "shards"
        make_shards(tree, shards, 128)
        shard_names = sorted(p.name for p in shards.iterdir())
        total = moto.upload_tree("bench", "shards", shards)
        tree_bytes = moto.upload_tree("bench", "tree", tree)
        mean = total / a.count
        common = ["--epochs", "3", "--batch-size", "64"]
        print(f"{a.count} JPEGs, {total / 1e6:.1f} MB in {len(list(shards.iterdir()))} shards "
              f"({mean / 1e3:.1f} kB per image)")
        # Per rate and reader: each round's epoch 0 against min(link, local)
        # and best later epoch against local, for the medians at the end.
        summary: dict[str, list[tuple[float, float]]] = {}
        for rnd in range(a.rounds):
            local, _ = epochs(["vision", shards, *common], dict(os.environ), tmp, "local")
            print(f"round {rnd}: local shards: epoch 0 {local[0]:.0f} img/s, "
                  f"later {max(local[1:]):.0f} img/s")
            local_stream, _ = epochs(["vision", shards, *common, "--stream-shards"], dict(os.environ), tmp,
                                     "local-stream")
            print(f"  local shards, --stream-shards: epoch 0 {local_stream[0]:.0f} img/s, "
                  f"later {max(local_stream[1:]):.0f} img/s")
            peer = subprocess.run(
                [os.environ.get("PEER_PYTHON", sys.executable), str(ROOT / "bench" / "remote_wds.py"),
                 *[str(shards / n) for n in shard_names], "--cache", str(tmp / f"wds-local-{rnd}"),
                 "--epochs", "3", "--workers", str(os.cpu_count() or 2)],
                capture_output=True, text=True)
            if peer.returncode == 0:
                w = json.loads(peer.stdout.strip().splitlines()[-1])["images_per_s"]
                print(f"  webdataset, local shards: epoch 0 {w[0]:.0f} img/s, later {max(w[1:]):.0f} img/s")
            for rate in (100e6, 50e6):
                proxy = FaultProxy(moto.port)
                proxy.rate = rate
                env = s3_env(proxy.url)
                link = rate / mean
                cache = tmp / f"cache-{rnd}-{int(rate)}"
                got, rem = epochs(["vision", "s3://bench/shards", *common, "--remote-cache", cache],
                                  env, tmp, "remote")
                # What the server and proxy deliver to plain downloads on
                # these same CPUs (4 curl at once), with nothing decoding.
                urls = [presign(moto, proxy, f"shards/{n}") for n in shard_names]
                t0 = time.monotonic()
                subprocess.run(["xargs", "-P", "4", "-n", "1", "curl", "-s", "-f", "-o", "/dev/null"],
                               input="\n".join(urls), text=True, check=True)
                served = total / (time.monotonic() - t0)
                print(f"  curl alone @ {rate / 1e6:.0f} MB/s: {served / 1e6:.1f} MB/s "
                      f"= {served / mean:.0f} img/s")
                bound = min(link, local[0])
                # Indexed shards are shuffled across shards, so every shard
                # is downloaded before the first sample: epoch 0's own bound
                # is the download, then the local epoch.
                serial = 1 / (1 / link + 1 / local[0])
                summary.setdefault(f"indexed shards @ {rate / 1e6:.0f} MB/s", []).append(
                    (got[0] / bound, max(got[1:]) / max(local[1:]), got[0] / serial))
                print(f"  shards @ {rate / 1e6:.0f} MB/s: epoch 0 {got[0]:.0f} img/s = "
                      f"{got[0] / bound:.0%} of min(link {link:.0f}, local {local[0]:.0f}), "
                      f"{got[0] / serial:.0%} of download then decode ({serial:.0f}), "
                      f"{got[0] / min(served / mean, local[0]):.0%} of min(curl alone, local); "
                      f"later {max(got[1:]):.0f} = {max(got[1:]) / max(local[1:]):.0%} of local; "
                      f"{rem['bytes_downloaded'] / 1e6:.1f} MB downloaded "
                      f"at {rem['download_mb_per_s']:.1f} MB/s")
                cache = tmp / f"stream-{rnd}-{int(rate)}"
                st, srem = epochs(["vision", "s3://bench/shards", *common, "--remote-cache", cache,
                                   "--stream-shards"], env, tmp, "stream", moto.proc.pid)
                # The same bound with the CPUs shared: what the proxy and
                # the server spent per image comes off the local rate.
                ncpu = len(os.sched_getaffinity(0))
                server_per_image = srem["server_cpu_s"] / a.count
                shared = 1 / (1 / local_stream[0] + server_per_image / ncpu)
                summary.setdefault(f"--stream-shards @ {rate / 1e6:.0f} MB/s", []).append(
                    (st[0] / bound, max(st[1:]) / max(local_stream[1:])))
                print(f"  shards @ {rate / 1e6:.0f} MB/s, --stream-shards: epoch 0 {st[0]:.0f} img/s = "
                      f"{st[0] / bound:.0%} of min(link, local), "
                      f"{st[0] / min(link, shared):.0%} of min(link, local with the proxy's and server's "
                      f"{srem['server_cpu_s']:.2f} CPU-s ({shared:.0f} img/s)), "
                      f"{st[0] / min(served / mean, local_stream[0]):.0%} of min(curl alone, local streamed "
                      f"{local_stream[0]:.0f}); later {max(st[1:]):.0f} = {max(st[1:]) / max(local_stream[1:]):.0%} "
                      f"of local streamed; {srem['bytes_downloaded'] / 1e6:.1f} MB downloaded")
                # The Python peer on the same shards, server and link.
                wds_cache = tmp / f"wds-{rnd}-{int(rate)}"
                peer = subprocess.run(
                    [os.environ.get("PEER_PYTHON", sys.executable), str(ROOT / "bench" / "remote_wds.py"),
                     *[presign(moto, proxy, f"shards/{n}") for n in shard_names],
                     "--cache", str(wds_cache), "--epochs", "3", "--workers", str(os.cpu_count() or 2)],
                    capture_output=True, text=True)
                if peer.returncode == 0:
                    w = json.loads(peer.stdout.strip().splitlines()[-1])["images_per_s"]
                    print(f"  webdataset (cache_dir) @ {rate / 1e6:.0f} MB/s: epoch 0 {w[0]:.0f} img/s = "
                          f"{w[0] / bound:.0%} of the bound; later {max(w[1:]):.0f}; "
                          f"ferrofeed / webdataset: epoch 0 {got[0] / w[0]:.2f}x, "
                          f"later {max(got[1:]) / max(w[1:]):.2f}x")
                else:
                    print(f"  webdataset failed: {peer.stderr.strip().splitlines()[-1:]}")
                for prefetch in () if a.shards_only else ("true", "false"):
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
        print(f"medians over {a.rounds} rounds (epoch 0 / min(link, local); later / local):")
        for name, v in summary.items():
            e0 = statistics.median(x[0] for x in v)
            later = statistics.median(x[1] for x in v)
            if name.startswith("indexed"):
                serial = statistics.median(x[2] for x in v)
                print(f"  {name}: epoch 0 {e0:.0%} (every shard downloaded first: {serial:.0%} of "
                      f"download then decode; --stream-shards is the link-rate epoch 0), "
                      f"later {later:.0%} (target 95%)")
            else:
                print(f"  {name}: epoch 0 {e0:.0%} (target 90%), later {later:.0%} (target 95%)")
    finally:
        moto.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
