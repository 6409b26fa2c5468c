"""ferrofeed.ray: ferrofeed pipelines as Ray Data datasets, on a local Ray
cluster started here (and a two-node cluster for the placement test)."""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ferrofeed  # noqa: E402
import ferrofeed.ray as fr  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def native_rows(loader, epoch, key):
    """index -> that sample's row of column ``key`` from the native loader."""
    out = {}
    for b in loader.epoch(epoch):
        for i, row in zip(b["indices"], b[key]):
            out[int(i)] = np.array(row)
    return out


def ray_rows(ds, key):
    rows = ds.take_all()
    idx = [int(r["indices"]) for r in rows]
    return idx, {int(r["indices"]): np.asarray(r[key]) for r in rows}


@pytest.mark.parametrize("tasks", [1, 3, 5])
def test_every_sample_once_and_the_same_rows_as_the_native_loader(local_ray, vision_dir, tasks):
    opts = dict(batch_size=4, seed=7, transform="train", size=32)
    want = native_rows(ferrofeed.vision(vision_dir, output="numpy", drop_last=False, **opts), 0, "images")
    ds = fr.read("vision", str(vision_dir), epoch=0, tasks=tasks, **opts)
    idx, got = ray_rows(ds, "images")
    assert sorted(idx) == list(range(24))
    for i in range(24):
        assert got[i].shape == (3, 32, 32) and got[i].dtype == np.uint8
        np.testing.assert_array_equal(got[i], want[i], err_msg=f"sample {i}")
    rep = fr.report(ds)
    assert [t["task"] for t in rep["tasks"]] == list(range(tasks))
    assert all(t["world_size"] == tasks for t in rep["tasks"])
    assert rep["samples"] == 24 and rep["skipped_count"] == 0


def test_a_new_epoch_reshuffles_and_augments_anew(local_ray, vision_dir):
    opts = dict(batch_size=4, seed=7, transform="train", size=32, tasks=2)
    _, e0 = ray_rows(fr.read("vision", str(vision_dir), epoch=0, **opts), "images")
    i1, e1 = ray_rows(fr.read("vision", str(vision_dir), epoch=1, **opts), "images")
    assert sorted(i1) == list(range(24))
    assert any(not np.array_equal(e0[i], e1[i]) for i in range(24))


def test_a_process_reuses_its_pipeline_for_the_next_epoch_with_the_same_rows(local_ray, vision_dir):
    opts = dict(batch_size=4, seed=11, transform="train", size=32)
    native = ferrofeed.vision(vision_dir, output="numpy", drop_last=False, **opts)
    ran = set()  # (pid, rank) that have run a task of this read
    warm = []
    for e in range(3):
        ds = fr.read("vision", str(vision_dir), epoch=e, tasks=1, **opts)
        idx, got = ray_rows(ds, "images")
        want = native_rows(native, e, "images")
        assert sorted(idx) == list(range(24))
        for i in range(24):
            np.testing.assert_array_equal(got[i], want[i], err_msg=f"epoch {e} sample {i}")
        for t in fr.report(ds)["tasks"]:
            # Warm exactly when this process ran this rank before.
            assert t["warm"] == ((t["pid"], t["rank"]) in ran)
            ran.add((t["pid"], t["rank"]))
            warm.append(t["warm"])
    assert any(warm), "Ray ran every epoch's task in a new process"


def test_text_rows_and_collate(local_ray, text_file):
    ds = fr.read("text", str(text_file), tasks=2, batch_size=16, max_length=24, seed=1)
    n = 0
    seen = []
    for b in ds.iter_torch_batches(batch_size=32, collate_fn=fr.collate):
        assert b["input_ids"].ndim == 2 and b["input_ids"].shape[1] <= 24
        assert b["input_ids"].shape == b["attention_mask"].shape
        seen += b["indices"].tolist()
        n += len(b["indices"])
    assert sorted(seen) == list(range(200)) and n == 200


def test_audio_rows(local_ray, audio_dir):
    opts = dict(batch_size=3, chunk_seconds=0.5, n_mels=40)
    want = native_rows(ferrofeed.audio(audio_dir, output="numpy", drop_last=False, **opts), 0, "features")
    idx, got = ray_rows(fr.read("audio", str(audio_dir), tasks=2, **opts), "features")
    assert sorted(idx) == sorted(want)
    for i in want:
        np.testing.assert_array_equal(got[i], want[i])


def test_streaming_split_covers_the_epoch(local_ray, vision_dir):
    ds = fr.read("vision", str(vision_dir), tasks=2, batch_size=4, transform="eval", size=32, resize=40)
    a, b = ds.streaming_split(2, equal=False)
    import threading

    seen = [[], []]

    def consume(it, out):
        for batch in it.iter_batches(batch_size=4):
            out += [int(i) for i in batch["indices"]]

    ts = [threading.Thread(target=consume, args=(s, o)) for s, o in zip((a, b), seen)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert sorted(seen[0] + seen[1]) == list(range(24))


def test_a_corrupt_sample_fails_with_its_index_path_and_stage(local_ray, corrupt_vision_dir):
    ds = fr.read("vision", str(corrupt_vision_dir), tasks=2, batch_size=4, shuffle=False)
    with pytest.raises(Exception) as e:
        ds.take_all()
    err = e.value
    # Ray wraps a task's exception; the cause is ferrofeed's own.
    found = None
    while err is not None:
        if isinstance(err, ferrofeed.SampleError):
            found = err
            break
        err = err.__cause__ or getattr(err, "cause", None)
    assert found is not None, repr(e.value)
    assert found.index == 8 and found.path.endswith("class1/img0.jpg") and found.stage == "decode"


def test_skipped_samples_are_reported_per_task_and_in_total(local_ray, corrupt_vision_dir):
    ds = fr.read("vision", str(corrupt_vision_dir), tasks=3, batch_size=4, on_error="skip")
    idx, _ = ray_rows(ds, "labels")
    assert sorted(idx) == [i for i in range(24) if i != 8]
    rep = fr.report(ds)
    assert rep["skipped_count"] == 1 and rep["samples"] == 23
    (s,) = rep["skipped"]
    assert s["index"] == 8 and s["path"].endswith("class1/img0.jpg") and s["stage"] == "decode"
    assert sum(len(t["skipped"]) for t in rep["tasks"]) == 1


@pytest.mark.parametrize(
    "kw, exc, named",
    [
        (dict(rank=0), ValueError, "rank"),
        (dict(world_size=2), ValueError, "world_size"),
        (dict(device="cuda"), ValueError, "device"),
        (dict(tasks=0), ValueError, "tasks"),
        (dict(batch_size="big"), ValueError, "batch_size"),
        (dict(bogus=1), TypeError, "bogus"),
    ],
)
def test_bad_options_are_refused_on_the_driver(vision_dir, kw, exc, named):
    with pytest.raises(exc, match=named):
        fr.FerrofeedDatasource("vision", str(vision_dir), **kw)


def test_a_missing_path_and_an_unknown_domain(tmp_path):
    with pytest.raises(FileNotFoundError):
        fr.FerrofeedDatasource("vision", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="domain"):
        fr.FerrofeedDatasource("video", str(tmp_path))


def test_ray_train_example_trains(tmp_path):
    env = dict(os.environ, RAY_TRAIN_STORAGE=str(tmp_path / "train"), RAY_ADDRESS="")
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ray_train.py"), "--steps", "3"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "loss" in r.stdout and "steps 3" in r.stdout


def test_a_url_passes_through_and_each_task_downloads_its_share(local_ray, vision_dir, tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from s3_servers import Moto, s3_env

    moto = Moto()
    try:
        total = moto.upload_tree("raydata", "tree", vision_dir)
        keys = ("AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
        env = {k: v for k, v in s3_env(moto.url).items() if k in keys}
        opts = dict(batch_size=4, transform="eval", size=32, resize=40, seed=3)
        ds = fr.read("vision", "s3://raydata/tree/", tasks=3, remote_cache=str(tmp_path / "cache"),
                     ray_args={"runtime_env": {"env_vars": env}}, **opts)
        idx, got = ray_rows(ds, "images")
        assert sorted(idx) == list(range(24))
        want = native_rows(ferrofeed.vision(str(vision_dir), output="numpy", **opts), 0, "images")
        assert all(np.array_equal(got[i], want[i]) for i in range(24))
        rep = fr.report(ds)
        # Each task downloads the objects of its own share; none twice. A task
        # may also prefetch its next epoch's first objects into the node's
        # shared cache, and a later task then takes those from the cache.
        assert all(t["remote"]["bytes_downloaded"] > 0 for t in rep["tasks"]), rep["tasks"]
        assert rep["remote"]["bytes_downloaded"] <= total, rep["tasks"]
        assert rep["remote"]["bytes_downloaded"] + rep["remote"]["bytes_from_cache"] >= total, rep["tasks"]
    finally:
        moto.stop()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_each_read_a_share_and_coverage_stays_exact(vision_dir, tmp_path):
    if ray.is_initialized():
        ray.shutdown()
    ray_bin = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    port = _free_port()
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    common = ["--num-cpus", "1", "--disable-usage-stats"]
    try:
        subprocess.run([ray_bin, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                        "--include-dashboard", "false"] + common,
                       env=env, check=True, capture_output=True, timeout=120)
        subprocess.run([ray_bin, "start", "--address", f"127.0.0.1:{port}", "--node-ip-address", "127.0.0.1"] + common,
                       env=env, check=True, capture_output=True, timeout=120)
        ray.init(address=f"127.0.0.1:{port}", log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        # Ray Data spreads read tasks over the nodes by default.
        ds = fr.read("vision", str(vision_dir), tasks=4, batch_size=4, transform="eval", size=32, resize=40)
        idx, _ = ray_rows(ds, "labels")
        assert sorted(idx) == list(range(24))
        rep = fr.report(ds)
        assert len({t["node_id"] for t in rep["tasks"]}) == 2, rep["tasks"]
        assert rep["samples"] == 24
    finally:
        ray.shutdown()
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)
