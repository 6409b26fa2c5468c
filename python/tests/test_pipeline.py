"""ferrofeed.Pipeline (PYTHON.md, "Pipelines"): native and Python stages on
one engine."""

import gc
import json
import os
import threading
import time

import numpy as np
import pytest

import ferrofeed as ff


def batches(loader):
    return [{k: np.asarray(v) for k, v in b.items()} for b in loader]


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k in x:
            assert np.array_equal(x[k], y[k]), k


VISION = dict(batch_size=8, seed=3, workers=2, output="numpy")


@pytest.mark.parametrize("transform", ["train", "eval"])
def test_native_stages_give_the_native_loaders_batches(vision_dir, transform):
    want = batches(ff.vision(vision_dir, transform=transform, size=32, resize=40, **VISION))
    p = (ff.Pipeline(ff.source.image_folder(vision_dir), **VISION)
         .read().decode_image(transform=transform, size=32, resize=40).build())
    got = batches(p)
    same(got, want)
    assert len(p) == len(want) == 3
    # The next epoch too (iteration = next epoch, as the native loaders).
    same(batches(p), batches(ff.vision(vision_dir, transform=transform, size=32, resize=40, **VISION).epoch(1)))


def jitter(sample, rng):
    img = sample["image"].astype(np.float32)
    sample["image"] = img * np.float32(rng.uniform(0.5, 1.5))
    sample["draw"] = int(rng.integers(0, 1 << 30))
    return sample


def test_a_python_map_sees_decoded_samples_and_its_rng_does_not_depend_on_workers(vision_dir):
    def run(workers):
        p = (ff.Pipeline(ff.source.image_folder(vision_dir), batch_size=8, seed=5, workers=workers, output="numpy")
             .read().decode_image(transform="train", size=32).map(jitter).build())
        return batches(p), batches(p)

    one, two = run(1), run(2)
    same(one[0], two[0])
    same(one[1], two[1])
    b = one[0][0]
    assert b["images"].shape == (8, 3, 32, 32) and b["images"].dtype == np.float32
    assert b["labels"].dtype == np.int64 and b["draw"].dtype == np.int64
    # Another epoch, other draws; each sample its own.
    assert not np.array_equal(one[0][0]["draw"], one[1][0]["draw"])
    assert len(set(np.concatenate([x["draw"] for x in one[0]]).tolist())) == 24


def test_the_image_a_map_gets_is_the_native_decode(vision_dir):
    seen = []
    p = (ff.Pipeline(ff.source.image_folder(vision_dir), shuffle=False, **{**VISION, "workers": 1})
         .read().decode_image(transform="eval", size=32, resize=40)
         .map(lambda s, rng: (seen.append((s["label"], s["image"].copy())), s)[1]).build())
    got = batches(p)
    want = batches(ff.vision(vision_dir, transform="eval", size=32, resize=40, shuffle=False, **{**VISION, "workers": 1}))
    same([{k: v for k, v in b.items() if k != "path"} for b in got], want)
    assert seen[0][1].shape == (3, 32, 32) and seen[0][1].dtype == np.uint8
    # And the file it came from, as the component `path`.
    assert [os.path.relpath(p, vision_dir) for p in got[0]["path"]][:2] == ["class0/img0.jpg", "class0/img1.jpg"]


def test_normalize_is_float32_of_the_decoded_pixels(vision_dir):
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    base = dict(shuffle=False, **VISION)
    raw = batches(ff.Pipeline(ff.source.image_folder(vision_dir), **base)
                  .read().decode_image(transform="eval", size=32, resize=40).build())
    norm = batches(ff.Pipeline(ff.source.image_folder(vision_dir), **base)
                   .read().decode_image(transform="eval", size=32, resize=40).normalize(mean, std).build())
    x = raw[0]["images"].astype(np.float32) / 255
    want = (x - np.array(mean, np.float32)[:, None, None]) / np.array(std, np.float32)[:, None, None]
    assert norm[0]["images"].dtype == np.float32
    np.testing.assert_allclose(norm[0]["images"], want, atol=1e-5)
    # And into a Python stage as float32.
    p = (ff.Pipeline(ff.source.image_folder(vision_dir), **base).read().decode_image(transform="eval", size=32, resize=40)
         .normalize(mean, std).map(lambda s, rng: {**s, "dtype": str(s["image"].dtype)}).build())
    b = next(iter(p))
    assert b["dtype"] == ["float32"] * 8
    np.testing.assert_allclose(np.asarray(b["images"]), norm[0]["images"], atol=1e-6)


def test_map_batches_runs_in_batch_order_with_its_own_rng(vision_dir):
    def tag(batch, rng):
        batch["batch_draw"] = np.full(len(batch["labels"]), rng.integers(0, 1 << 30))
        return batch

    def run(workers):
        p = (ff.Pipeline(ff.source.image_folder(vision_dir), batch_size=8, seed=1, workers=workers, output="numpy")
             .read().decode_image(transform="train", size=32).map_batches(tag, name="tag").build())
        return batches(p)

    a, b = run(1), run(2)
    same(a, b)
    draws = [int(x["batch_draw"][0]) for x in a]
    assert len(set(draws)) == 3


class Rows:
    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"x": np.full((2,), i, np.float32), "n": i, "f": i / 2, "input_ids": list(range(i % 3 + 1)),
                "name": f"s{i}"}


def test_a_sequence_source_and_the_default_collate_rules():
    p = ff.Pipeline(ff.source.sequence(Rows()), batch_size=4, shuffle=False, output="numpy").build()
    got = batches(p)
    assert [b["indices"].tolist() for b in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    b = got[0]
    assert b["x"].shape == (4, 2) and b["x"].dtype == np.float32
    assert b["n"].dtype == np.int64 and b["n"].tolist() == [0, 1, 2, 3]
    assert b["f"].dtype == np.float64
    assert b["input_ids"].tolist() == [[0, 0, 0], [0, 1, 0], [0, 1, 2], [0, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]]
    assert list(b["name"]) == ["s0", "s1", "s2", "s3"]
    # Not a dict: the component `item`.
    q = ff.Pipeline(ff.source.sequence(list(range(5))), batch_size=5, shuffle=False, output="numpy").build()
    assert next(iter(q))["item"].tolist() == [0, 1, 2, 3, 4]


def test_torch_output_shares_the_collated_arrays():
    torch = pytest.importorskip("torch")
    p = ff.Pipeline(ff.source.sequence(Rows()), batch_size=4, shuffle=False).build()
    b = next(iter(p))
    assert isinstance(b["x"], torch.Tensor) and b["x"].dtype == torch.float32
    assert isinstance(b["indices"], torch.Tensor)


def test_a_collate_of_ones_own():
    p = (ff.Pipeline(ff.source.sequence(Rows()), batch_size=5, shuffle=False, output="numpy")
         .collate(lambda samples: {"total": np.array([sum(s["n"] for s in samples)])}).build())
    assert [b["total"].tolist() for b in p] == [[10], [35]]


def test_build_checks_the_flow_and_the_keywords(vision_dir):
    src = ff.source.image_folder(vision_dir)
    with pytest.raises(ValueError, match="'decode' reads component 'bytes'"):
        ff.Pipeline(src).decode_image().build()
    with pytest.raises(ValueError, match="'normalize' reads component 'image'.*Python stage 'jitter'"):
        ff.Pipeline(src).read().decode_image().map(jitter).normalize((0, 0, 0), (1, 1, 1)).build()
    with pytest.raises(ValueError, match="'read' reads component 'path'.*Python objects"):
        ff.Pipeline(ff.source.sequence(Rows())).read().build()
    with pytest.raises(ValueError, match="decoded"):
        ff.Pipeline(src).read().map(jitter).build()
    with pytest.raises(TypeError, match="decode_image\\(\\) got an unexpected keyword argument 'sise'"):
        ff.Pipeline(src).read().decode_image(sise=3)
    with pytest.raises(TypeError, match="Pipeline\\(\\) got an unexpected keyword argument 'batchsize'"):
        ff.Pipeline(src, batchsize=3)
    with pytest.raises(ValueError, match="batch_size"):
        ff.Pipeline(src, batch_size=0).read().decode_image().build()
    with pytest.raises(ValueError, match="transform"):
        ff.Pipeline(src).read().decode_image(transform="rotate").build()
    with pytest.raises(FileNotFoundError):
        ff.source.image_folder(os.path.join(vision_dir, "nope"))
    with pytest.raises(TypeError):
        ff.source.sequence(42)


class Boom(Exception):
    pass


def explode_at_5(sample, rng):
    if sample["n"] == 5:
        raise Boom("no five")
    return sample


def test_a_python_stage_that_raises_is_a_sample_error_caused_by_it():
    p = (ff.Pipeline(ff.source.sequence(Rows()), batch_size=2, shuffle=False, output="numpy")
         .map(explode_at_5, name="explode").build())
    with pytest.raises(ff.SampleError) as e:
        list(p)
    assert e.value.index == 5 and e.value.stage == "explode"
    assert isinstance(e.value.__cause__, Boom) and "no five" in str(e.value.__cause__)
    assert e.value.__cause__.__traceback__ is not None
    assert "explode_at_5" in repr(e.value.__cause__.__traceback__.tb_frame) or e.value.__cause__.__traceback__.tb_next


def test_under_skip_a_raising_sample_is_skipped_and_reported():
    p = (ff.Pipeline(ff.source.sequence(Rows()), batch_size=2, shuffle=False, on_error="skip", output="numpy")
         .map(explode_at_5, name="explode").build())
    got = [i for b in p for i in b["indices"].tolist()]
    assert got == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    skipped = p.report()["skipped"]
    assert [(s["index"], s["stage"]) for s in skipped] == [(5, "explode")]


def test_a_stage_that_returns_no_dict_is_named():
    p = ff.Pipeline(ff.source.sequence(Rows()), batch_size=2).map(lambda s, rng: 3, name="three").build()
    with pytest.raises(ff.SampleError, match="stage \"three\" returned int, not a dict"):
        list(p)


def test_ragged_samples_fail_the_collate_naming_the_sample_and_component():
    def ragged(s, rng):
        s["x"] = np.zeros(3 if s["n"] == 2 else 2, np.float32)
        return s

    p = ff.Pipeline(ff.source.sequence(Rows()), batch_size=4, shuffle=False).map(ragged).build()
    with pytest.raises(ff.SampleError) as e:
        list(p)
    assert e.value.stage == "collate" and e.value.index == 2
    assert "component 'x' of sample 2" in str(e.value)


def test_an_index_error_early_in_getitem_is_a_sample_error():
    class Short(Rows):
        def __getitem__(self, i):
            if i >= 4:
                raise IndexError(f"only 4, not {i}")
            return super().__getitem__(i)

    p = ff.Pipeline(ff.source.sequence(Short(10)), batch_size=2, shuffle=False).build()
    with pytest.raises(ff.SampleError) as e:
        list(p)
    assert e.value.index == 4 and isinstance(e.value.__cause__, IndexError)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_state_dict_resumes_exactly_with_python_stages(vision_dir, k):
    def make():
        return (ff.Pipeline(ff.source.image_folder(vision_dir), batch_size=8, seed=9, workers=2, output="numpy")
                .read().decode_image(transform="train", size=32).map(jitter).build())

    whole = batches(make()) + batches(make().epoch(1))
    first = make()
    it = iter(first)
    before = [{kk: np.asarray(v) for kk, v in next(it).items()} for _ in range(k)]
    state = json.loads(json.dumps(first.state_dict()))
    del it, first
    resumed = make()
    resumed.load_state_dict(state)
    after = batches(resumed) + batches(resumed)
    same(before + after, whole)


def test_the_report_names_python_stages_with_their_gil_time(vision_dir, tmp_path):
    p = (ff.Pipeline(ff.source.image_folder(vision_dir), **VISION)
         .read().decode_image(transform="train", size=32).map(jitter).map_batches(lambda b, rng: b, name="pass").build())
    list(p)
    r = p.report()
    assert r["python_stages"]["jitter"]["calls"] == 24
    assert r["python_stages"]["jitter"]["gil_seconds"] > 0
    assert r["python_stages"]["pass"]["calls"] == 3
    assert {"read", "decode", "jitter"} <= {s["name"] for s in r["stages"]}
    p.report_html(str(tmp_path / "r.html"))
    assert "jitter" in (tmp_path / "r.html").read_text()


def threads():
    return len(os.listdir("/proc/self/task"))


def test_deleting_a_loader_mid_epoch_with_python_stages_joins_its_threads():
    class Slow(Rows):
        def __getitem__(self, i):
            time.sleep(0.01)
            return super().__getitem__(i)

    before = threads()
    for _ in range(3):
        p = (ff.Pipeline(ff.source.sequence(Slow(200)), batch_size=4, workers=2)
             .map(lambda s, rng: (time.sleep(0.005), s)[1]).build())
        it = iter(p)
        next(it)
        done = threading.Event()

        def drop():
            nonlocal p, it
            del it, p
            gc.collect()
            done.set()

        t = threading.Thread(target=drop)
        t.start()
        assert done.wait(20), "deleting the loader hung"
        t.join()
    deadline = time.time() + 10
    while threads() > before + 1 and time.time() < deadline:
        time.sleep(0.05)
    assert threads() <= before + 1


def test_shards_decode_as_the_native_loader_reads_them(vision_dir, tmp_path):
    import io
    import tarfile

    files = sorted((d.name, f) for d in sorted(os.scandir(vision_dir), key=lambda e: e.name) if d.is_dir()
                   for f in sorted(os.listdir(d.path)))
    for s in range(2):
        with tarfile.open(tmp_path / f"shard-{s}.tar", "w") as tar:
            for k, (cls, name) in enumerate(files[s::2]):
                label = int(cls[-1])
                for ext, data in (("jpg", open(os.path.join(vision_dir, cls, name), "rb").read()),
                                  ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{s:02}{k:03}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    opts = dict(transform="eval", size=32, resize=40)
    want = batches(ff.vision(str(tmp_path), **opts, **VISION))
    got = batches(ff.Pipeline(ff.source.shards(tmp_path), **VISION).decode_image(**opts).build())
    same(got, want)
    with_map = batches(ff.Pipeline(ff.source.shards(tmp_path), **VISION).decode_image(**opts)
                       .map(lambda s, rng: {**s, "twice": s["label"] * 2}).build())
    assert [b["twice"].tolist() for b in with_map] == [(b["labels"] * 2).tolist() for b in want]
    # Each sample's shard member (`shard.tar#key`), as the component `key`.
    assert all(os.path.basename(k).startswith("shard-") and ".tar#" in k for b in with_map for k in b["key"])
    with pytest.raises(ValueError, match="'read' reads component 'path', which neither source.shards"):
        ff.Pipeline(ff.source.shards(tmp_path)).read().decode_image().build()


@pytest.mark.parametrize("batching", [dict(batch_size=16), dict(max_tokens=512)])
def test_text_lines_and_tokenize_give_the_text_loaders_batches(text_file, batching):
    opts = dict(seed=2, workers=2, output="numpy", **batching)
    want = batches(ff.text(text_file, max_length=32, **opts))
    p = ff.Pipeline(ff.source.text_lines(text_file), **opts).tokenize(max_length=32).build()
    same(batches(p), want)

    def count(sample, rng):
        sample["n_tokens"] = len(sample["input_ids"])
        return sample

    q = ff.Pipeline(ff.source.text_lines(text_file), **opts).tokenize(max_length=32).map(count).build()
    got = batches(q)
    assert [b["indices"].tolist() for b in got] == [b["indices"].tolist() for b in want]
    for g, w in zip(got, want):
        assert g["n_tokens"].tolist() == w["attention_mask"].sum(1).tolist()
        width = g["input_ids"].shape[1]
        assert np.array_equal(g["input_ids"], w["input_ids"][:, :width])
    with pytest.raises(ValueError, match="add .tokenize"):
        ff.Pipeline(ff.source.text_lines(text_file)).map(count).build()


def test_audio_chunks_and_features_give_the_audio_loaders_batches(audio_dir):
    opts = dict(batch_size=4, seed=1, workers=2, output="numpy")
    want = batches(ff.audio(audio_dir, chunk_seconds=1, features="mel", n_mels=40, time_masks=1,
                            time_mask_width=5, **opts))
    p = (ff.Pipeline(ff.source.audio(audio_dir, chunk_seconds=1), **opts)
         .features("mel", n_mels=40).augment(time_masks=1, time_mask_width=5).build())
    same(batches(p), want)

    def energy(sample, rng):
        sample["energy"] = float(sample["features"].sum())
        return sample

    q = (ff.Pipeline(ff.source.audio(audio_dir, chunk_seconds=1), **opts)
         .features("mel", n_mels=40).augment(time_masks=1, time_mask_width=5).map(energy).build())
    got = batches(q)
    assert [b["indices"].tolist() for b in got] == [b["indices"].tolist() for b in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g["energy"], w["features"].reshape(len(w["features"]), -1).sum(1), rtol=1e-4)
        # Python-collated columns keep their component's name.
        assert np.array_equal(g["chunk_start"], w["chunk_starts"]) and np.array_equal(g["length"], w["lengths"])
    # Without features: the waveform, as `audio`.
    raw = next(iter(ff.Pipeline(ff.source.audio(audio_dir, chunk_seconds=1), **opts)
                    .map(lambda s, rng: {**s, "peak": float(np.abs(s["audio"]).max())}).build()))
    assert raw["audio"].shape == (4, 16000) and raw["audio"].dtype == np.float32
    assert all(p.startswith(str(audio_dir)) and p.endswith(".wav") for p in raw["path"])
    with pytest.raises(TypeError, match="audio\\(\\) got an unexpected keyword argument 'n_mels'"):
        ff.source.audio(audio_dir, n_mels=3)
    with pytest.raises(ValueError, match="'augment' reads component 'features', which neither source.audio"):
        ff.Pipeline(ff.source.audio(audio_dir)).augment(time_masks=1).build()


def shard_items(shard, num_shards):
    return ({"n": i, "x": np.full(2, i, np.float32)} for i in range(shard, 100, num_shards))


def test_an_iterable_factory_is_read_shard_by_shard_each_item_once():
    def run(workers, **kw):
        p = (ff.Pipeline(ff.source.iterable(shard_items, num_shards=8), batch_size=8, seed=4, workers=workers,
                         output="numpy", **kw)
             .map(lambda s, rng: {**s, "r": float(rng.random())}).build())
        return batches(p)

    one, two = run(1), run(2)
    same(one, two)
    got = sorted(int(n) for b in one for n in b["n"])
    assert got == list(range(100))
    ranks = [sorted(int(n) for b in run(2, rank=r, world_size=2, pad_shards=False) for n in b["n"]) for r in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == list(range(100)) and not set(ranks[0]) & set(ranks[1])


def test_an_iterable_that_raises_is_a_sample_error_caused_by_it():
    def bad(shard, num_shards):
        yield {"n": shard}
        raise Boom(f"shard {shard} broke")

    p = ff.Pipeline(ff.source.iterable(bad, num_shards=2), batch_size=2, shuffle=False, workers=1).build()
    with pytest.raises(ff.SampleError) as e:
        list(p)
    assert isinstance(e.value.__cause__, Boom)


def test_dropping_a_loader_in_the_thread_that_iterates_it_mid_epoch_does_not_hang():
    """The loader is dropped while workers sit in Python stages, waiting for
    the GIL its owner holds: its threads are joined with the GIL released.
    Run in a child, so a hang fails the test instead of stalling the run."""
    import subprocess
    import sys

    script = """
import time, numpy as np, ferrofeed as ff
def slow(s, rng):
    time.sleep(0.002)
    return {"x": np.zeros(64, np.float32) + s["item"]}
for _ in range(20):
    b = next(iter(ff.Pipeline(ff.source.sequence(list(range(400))), batch_size=4, workers=2, output="numpy")
                  .map(slow).build()))
    assert b["x"].shape == (4, 64)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
