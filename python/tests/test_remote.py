"""Datasets in object storage, against moto's S3 server on loopback (and a
fault-injecting proxy in front of it): the same batches as the local copy,
the cache, eviction, shared use, faults, dead servers, the package."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from s3_servers import FaultProxy, Moto, s3_env

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("FERROFEED_BIN", ROOT / "target" / "debug" / "ferrofeed"))

pytestmark = pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built (./test.sh builds it)")


@pytest.fixture(scope="module")
def moto():
    m = Moto()
    yield m
    m.stop()


@pytest.fixture
def proxy(moto):
    p = FaultProxy(moto.port)
    yield p
    p.stop()


def run(args, env, timeout=300, check=True):
    r = subprocess.run(
        [str(BIN), *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and r.returncode != 0:
        raise AssertionError(f"{args} exited {r.returncode}:\n{r.stderr}\n{r.stdout}")
    return r


def dumps(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.glob("*.npy"))}


@pytest.fixture(scope="module")
def tree(tmp_path_factory, moto):
    """A 48-image ImageFolder, locally and as s3://data/tree."""
    root = tmp_path_factory.mktemp("tree")
    subprocess.run([str(BIN), "make-dataset", "vision", str(root), "--count", "48"], check=True,
                   capture_output=True)
    # The file that marks a folder make-dataset wrote is no part of a
    # user's tree.
    (root / ".ferrofeed-synth").unlink()
    total = moto.upload_tree("data", "tree", root)
    return root, total


@pytest.fixture(scope="module")
def shards(tmp_path_factory, moto, tree):
    """The tree as three WebDataset shards, locally and as s3://data/shards."""
    src, _ = tree
    out = tmp_path_factory.mktemp("shards")
    files = sorted(src.rglob("*.jpg"))
    classes = sorted({p.parent.name for p in files})
    for s in range(3):
        with tarfile.open(out / f"shard-{s:03}.tar", "w") as t:
            for i, p in enumerate(files[s::3]):
                key = f"s{s}_{i:03}"
                t.add(p, arcname=f"{key}.jpg")
                cls = out / "cls.tmp"
                cls.write_text(str(classes.index(p.parent.name)))
                t.add(cls, arcname=f"{key}.cls")
    (out / "cls.tmp").unlink()
    total = moto.upload_tree("data", "shards", out)
    return out, total


COMMON = ["--epochs", "1", "--batch-size", "8", "--workers", "2", "--quiet", "--seed", "3"]


def local_run(path, tmp, name, extra=()):
    d = tmp / name
    run(["vision", path, *COMMON, "--dump", d, *extra], dict(os.environ))
    return d


def test_tree_gives_the_local_batches_and_a_second_run_reads_the_cache(moto, tree, tmp_path):
    root, total = tree
    env = s3_env(moto.url)
    want = dumps(local_run(root, tmp_path, "local"))
    cache = tmp_path / "cache"
    for attempt in range(2):
        d = tmp_path / f"remote{attempt}"
        rep = tmp_path / f"r{attempt}.json"
        trace = tmp_path / f"t{attempt}.json"
        r = run(["vision", "s3://data/tree", *COMMON, "--dump", d, "--report-json", rep,
                 "--remote-cache", cache, "--trace", trace], env)
        assert dumps(d) == want
        report = json.loads(rep.read_text())
        remote = report["remote"]
        if attempt == 0:
            assert remote["bytes_downloaded"] == total and remote["bytes_from_cache"] == 0
            assert f"{total / 1e6:.1f} MB downloaded" in r.stdout
            # Download rates on the timeline: summed over their intervals,
            # the bytes downloaded while it ran; and a counter track.
            tl = report["timeline"]
            assert tl["meters"] == ["bytes downloaded"]
            t0, got = 0.0, 0.0
            for p in tl["points"]:
                got += p["meter_rates"][0] * (p["t_s"] - t0)
                t0 = p["t_s"]
            assert 0 < got <= total * 1.001, (got, total)
            events = json.loads(trace.read_text())["traceEvents"]
            assert any(e.get("ph") == "C" and e["name"] == "bytes downloaded" for e in events)
        else:
            assert remote["bytes_downloaded"] == 0 and remote["bytes_from_cache"] == total
        assert remote["retries"] == 0
    index = json.loads((d / "index.json").read_text())
    local = json.loads((tmp_path / "local" / "index.json").read_text())
    assert len(index) == 48
    for a, b in zip(index, local):
        rel = Path(b["path"]).relative_to(root).as_posix()
        assert a["path"] == f"s3://data/tree/{rel}" and a["label"] == b["label"]


def test_shards_give_the_local_batches_and_urls_in_the_index(moto, shards, tmp_path):
    out, total = shards
    want = dumps(local_run(out, tmp_path, "local"))
    d = tmp_path / "remote"
    rep = tmp_path / "r.json"
    run(["vision", "s3://data/shards", *COMMON, "--dump", d, "--report-json", rep,
         "--remote-cache", tmp_path / "cache"], s3_env(moto.url))
    assert dumps(d) == want
    assert json.loads(rep.read_text())["remote"]["bytes_downloaded"] == total
    paths = [e["path"] for e in json.loads((d / "index.json").read_text())]
    assert paths[0] == "s3://data/shards/shard-000.tar#s0_000", paths[:2]


def test_streamed_shards_give_the_local_streamed_batches_through_faults(moto, shards, proxy, tmp_path):
    """--stream-shards: each shard downloaded when the epoch reaches it (in
    its order, ahead of the workers), the batches those of the local shards
    read the same way, across two epochs, through 503s and cut bodies; a
    second run reads the cache."""
    out, total = shards
    two = [*COMMON[:1], "2", *COMMON[2:]]
    want = tmp_path / "local"
    run(["vision", out, *two, "--stream-shards", "--dump", want], dict(os.environ))
    proxy.fail_every, proxy.cut_every = 2, 3
    cache = tmp_path / "cache"
    for attempt in range(2):
        d = tmp_path / f"remote{attempt}"
        rep = tmp_path / f"r{attempt}.json"
        run(["vision", "s3://data/shards", *two, "--stream-shards", "--dump", d, "--report-json", rep,
             "--remote-cache", cache], s3_env(proxy.url))
        assert dumps(d) == dumps(want)
        remote = json.loads(rep.read_text())["remote"]
        if attempt == 0:
            # Cut bodies were received in part before their retries.
            assert remote["bytes_downloaded"] >= total, remote
            assert proxy.failed > 0 and proxy.cut > 0
            assert remote["retries"] >= proxy.failed + proxy.cut - 1, (remote, proxy.failed, proxy.cut)
        else:
            assert remote["bytes_downloaded"] == 0, remote
    index = json.loads((d / "index.json").read_text())
    assert len(index) == 48
    assert all(e["path"].startswith("s3://data/shards/shard-00") for e in index), index[:2]


def test_a_single_shard_over_plain_http(moto, shards, tmp_path):
    out, _ = shards
    # Plain HTTP carries no credentials: the object is public.
    moto.client().put_object(Bucket="data", Key="public/shard-001.tar", ACL="public-read",
                             Body=(out / "shard-001.tar").read_bytes())
    want = dumps(local_run(out / "shard-001.tar", tmp_path, "local"))
    d = tmp_path / "http"
    run(["vision", f"{moto.url}/data/public/shard-001.tar", *COMMON, "--dump", d,
         "--remote-cache", tmp_path / "cache"], dict(os.environ))
    assert dumps(d) == want


def test_faults_lose_nothing(moto, tree, proxy, tmp_path):
    """503s, bodies cut in half and a 20 MB/s link: the same batches, with
    the retries counted."""
    root, _ = tree
    want = dumps(local_run(root, tmp_path, "local"))
    proxy.fail_every, proxy.cut_every, proxy.rate = 5, 4, 20e6
    d = tmp_path / "faulty"
    rep = tmp_path / "r.json"
    run(["vision", "s3://data/tree", *COMMON, "--dump", d, "--report-json", rep,
         "--remote-cache", tmp_path / "cache", "--download-workers", "4"], s3_env(proxy.url))
    assert dumps(d) == want
    remote = json.loads(rep.read_text())["remote"]
    assert proxy.failed > 0 and proxy.cut > 0
    assert remote["retries"] >= proxy.failed + proxy.cut - 1, (remote, proxy.failed, proxy.cut)


def test_a_cut_body_is_resumed_from_where_it_stopped(moto, tree, proxy, tmp_path):
    """Every other response cut in half: each retry asks for the rest of
    the object (a ranged GET), so no byte is downloaded twice and the
    batches are the local ones."""
    root, total = tree
    want = dumps(local_run(root, tmp_path, "local"))
    proxy.cut_every = 2
    d = tmp_path / "cut"
    rep = tmp_path / "r.json"
    run(["vision", "s3://data/tree", *COMMON, "--dump", d, "--report-json", rep,
         "--remote-cache", tmp_path / "cache", "--download-workers", "4"], s3_env(proxy.url))
    assert dumps(d) == want
    remote = json.loads(rep.read_text())["remote"]
    assert proxy.cut > 10 and proxy.ranged > 0, (proxy.cut, proxy.ranged)
    assert remote["bytes_downloaded"] == total, (remote, total)


def test_eviction_keeps_the_cap_across_epochs(moto, tree, tmp_path):
    root, total = tree
    cap = total // 3
    env = s3_env(moto.url)
    want = tmp_path / "local"
    run(["vision", root, *COMMON[2:], "--epochs", "2", "--dump", want], dict(os.environ))
    d = tmp_path / "remote"
    rep = tmp_path / "r.json"
    cache = tmp_path / "cache"
    run(["vision", "s3://data/tree", *COMMON[2:], "--epochs", "2", "--dump", d,
         "--report-json", rep, "--remote-cache", cache, "--remote-cache-size", str(cap)], env)
    assert dumps(d) == dumps(want)
    held = sum(p.stat().st_size for p in (cache / "objects").iterdir() if p.is_file())
    assert 0 < held <= cap, (held, cap)
    # The second epoch found most objects evicted: they were downloaded again.
    assert json.loads(rep.read_text())["remote"]["bytes_downloaded"] > total


def test_two_processes_share_one_cache_without_downloading_twice(moto, tree, proxy, tmp_path):
    root, total = tree
    proxy.rate = 10e6  # slow enough that the two runs overlap
    env = s3_env(proxy.url)
    cache = tmp_path / "cache"
    results = {}

    def one(rank):
        rep = tmp_path / f"r{rank}.json"
        run(["vision", "s3://data/tree", *COMMON, "--dump", tmp_path / f"d{rank}",
             "--report-json", rep, "--remote-cache", cache], env)
        results[rank] = json.loads(rep.read_text())["remote"]

    threads = [threading.Thread(target=one, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert dumps(tmp_path / "d0") == dumps(tmp_path / "d1")
    downloaded = results[0]["bytes_downloaded"] + results[1]["bytes_downloaded"]
    assert downloaded == total, results
    assert results[0]["bytes_from_cache"] + results[1]["bytes_from_cache"] == total


def test_a_dead_server_is_a_clear_error_naming_the_url(tmp_path):
    from s3_servers import free_port

    env = s3_env(f"http://127.0.0.1:{free_port()}")
    t = time.monotonic()
    r = run(["vision", "s3://data/tree", *COMMON, "--remote-cache", tmp_path / "c",
             "--remote-retries", "2"], env, check=False)
    assert r.returncode != 0
    assert "s3://data/tree" in r.stderr and "listing failed" in r.stderr, r.stderr
    assert time.monotonic() - t < 30


def test_a_server_that_never_answers_times_out(moto, tree, proxy, tmp_path):
    proxy.hang = True
    r = run(["vision", "s3://data/tree", *COMMON, "--remote-cache", tmp_path / "c",
             "--remote-retries", "1", "--remote-timeout", "1"], s3_env(proxy.url), check=False,
            timeout=60)
    assert r.returncode != 0
    assert "s3://data/tree" in r.stderr and "no answer" in r.stderr, r.stderr


def test_an_empty_or_missing_prefix_is_refused(moto, tree, tmp_path):
    env = s3_env(moto.url)
    r = run(["vision", "s3://data/nothing-here", *COMMON, "--remote-cache", tmp_path / "c"], env,
            check=False)
    assert r.returncode != 0 and "s3://data/nothing-here: no objects under this prefix" in r.stderr
    r = run(["vision", "s3://no-such-bucket/x", *COMMON, "--remote-cache", tmp_path / "c",
             "--remote-retries", "0"], env, check=False)
    assert r.returncode != 0 and "s3://no-such-bucket/x" in r.stderr, r.stderr


def test_text_and_audio_give_the_local_batches(moto, tmp_path):
    env = s3_env(moto.url)
    for domain, count, flags in [
        ("text", 2, ["--max-length", "32"]),
        ("audio", 3, ["--chunk-seconds", "1"]),
    ]:
        src = tmp_path / f"{domain}-src"
        run(["make-dataset", domain, src, "--count", str(count)], dict(os.environ))
        moto.upload_tree("data", domain, src)
        common = [*COMMON, *flags]
        run([domain, src, *common, "--dump", tmp_path / f"{domain}-local"], dict(os.environ))
        run([domain, f"s3://data/{domain}", *common, "--dump", tmp_path / f"{domain}-remote",
             "--remote-cache", tmp_path / "cache"], env)
        assert dumps(tmp_path / f"{domain}-remote") == dumps(tmp_path / f"{domain}-local")
        index = json.loads((tmp_path / f"{domain}-remote" / "index.json").read_text())
        assert all(e["path"].startswith(f"s3://data/{domain}/") for e in index), index[:2]


def test_the_package_reads_urls_through_the_same_options(moto, tree, tmp_path, monkeypatch):
    import ferrofeed

    root, total = tree
    for k, v in s3_env(moto.url).items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    opts = dict(batch_size=8, workers=2, seed=3, output="numpy")
    local = [b["images"].copy() for b in ferrofeed.vision(str(root), **opts)]
    loader = ferrofeed.vision("s3://data/tree", remote_cache=str(tmp_path / "c"), **opts)
    remote = [b["images"].copy() for b in loader]
    assert len(remote) == len(local) and all(np.array_equal(a, b) for a, b in zip(local, remote))
    assert loader.report()["remote"]["bytes_downloaded"] == total
