"""The native loaders as a training loop uses them (PYTHON.md, "Native loaders")."""

import gc
import json
import os
import threading
import time
import wave

import numpy as np
import pytest

import ferrofeed

torch = pytest.importorskip("torch")


def as_np(batch):
    return {k: np.asarray(v).copy() for k, v in batch.items()}


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_version_is_the_crate_version():
    cargo = open(os.path.join(os.path.dirname(__file__), "..", "..", "Cargo.toml")).read()
    assert f'version = "{ferrofeed.__version__}"' in cargo


def test_vision_batches_are_torch_tensors_named_as_dump(vision_dir):
    loader = ferrofeed.vision(vision_dir, batch_size=5, transform="eval", size=64, resize=72)
    assert len(loader) == 5  # 24 images, the short last batch kept
    batches = list(loader)
    assert len(batches) == 5
    b = batches[0]
    assert set(b) == {"images", "labels", "indices"}
    assert isinstance(b["images"], torch.Tensor)
    assert b["images"].shape == (5, 3, 64, 64) and b["images"].dtype == torch.uint8
    assert b["labels"].dtype == torch.int64 and b["indices"].dtype == torch.int64
    seen = torch.cat([x["indices"] for x in batches]).tolist()
    assert sorted(seen) == list(range(24))
    # labels follow the sorted class folders: 8 images per class
    for x in batches:
        assert (x["labels"] == x["indices"] // 8).all()


def test_numpy_output_and_zero_copy(vision_dir):
    loader = ferrofeed.vision(vision_dir, batch_size=4, transform="eval", size=32, resize=40, output="numpy")
    b = next(iter(loader))
    assert isinstance(b["images"], np.ndarray) and b["images"].shape == (4, 3, 32, 32)
    # The array is a view of ferrofeed's buffer, not a copy: its base is the
    # exported column, and DLPack of the same column points at the same bytes.
    col = b["images"].base
    assert isinstance(col, ferrofeed.Array)
    t = torch.from_dlpack(col)
    assert t.data_ptr() == b["images"].ctypes.data
    t[0, 0, 0, 0] = 7
    assert b["images"][0, 0, 0, 0] == 7


def test_tensors_outlive_the_loader(vision_dir):
    loader = ferrofeed.vision(vision_dir, batch_size=8, transform="eval", size=48, resize=56)
    kept = next(iter(loader))
    copy = {k: v.clone() for k, v in kept.items()}
    del loader
    gc.collect()
    _ = [np.ones(1 << 16) for _ in range(50)]  # reuse freed memory if it were freed
    for k in kept:
        assert torch.equal(kept[k], copy[k]), k


def test_same_seed_same_batches_and_epochs_advance(vision_dir):
    a = ferrofeed.vision(vision_dir, batch_size=6, seed=3)
    b = ferrofeed.vision(vision_dir, batch_size=6, seed=3)
    a0 = [as_np(x) for x in a]
    a1 = [as_np(x) for x in a]  # the second loop is epoch 1
    b1 = [as_np(x) for x in b.epoch(1)]
    assert len(a0) == len(a1) == len(b1) == 4
    for x, y in zip(a1, b1):
        same(x, y)
    assert any((x["indices"] != y["indices"]).any() for x, y in zip(a0, a1)), "epochs reshuffle"


def test_breaking_out_starts_the_next_epoch_cleanly(vision_dir):
    a = ferrofeed.vision(vision_dir, batch_size=4, seed=1, transform="eval", size=32, resize=40)
    for i, _ in enumerate(a):
        if i == 1:
            break
    got = [as_np(x) for x in a]  # epoch 1, whole
    want = [as_np(x) for x in ferrofeed.vision(vision_dir, batch_size=4, seed=1, transform="eval", size=32, resize=40).epoch(1)]
    assert len(got) == len(want) == 6
    for x, y in zip(got, want):
        same(x, y)


@pytest.mark.parametrize("k", [0, 1, 3, 6])
def test_state_dict_resumes_exactly(vision_dir, k):
    opts = dict(batch_size=4, seed=5, transform="train", size=32)
    whole = ferrofeed.vision(vision_dir, **opts)
    want = [as_np(x) for x in whole] + [as_np(x) for x in whole]
    part = ferrofeed.vision(vision_dir, **opts)
    it = iter(part)
    for _ in range(k):
        next(it)
    state = json.loads(json.dumps(part.state_dict()))
    del part, it
    fresh = ferrofeed.vision(vision_dir, **opts)
    fresh.load_state_dict(state)
    rest = [as_np(x) for x in fresh] + [as_np(x) for x in fresh]
    assert len(rest) == len(want) - k
    for x, y in zip(rest, want[k:]):
        same(x, y)


def test_text_and_audio_state_resumes_exactly(text_file, audio_dir):
    for make, opts in [
        (lambda **o: ferrofeed.text(text_file, **o), dict(batch_size=16, seed=2, max_length=32)),
        (lambda **o: ferrofeed.audio(audio_dir, **o), dict(batch_size=3, seed=2, chunk_seconds=0.5)),
    ]:
        want = [as_np(x) for x in make(**opts)]
        part = make(**opts)
        it = iter(part)
        next(it)
        next(it)
        state = part.state_dict()
        part.close()
        fresh = make(**opts)
        fresh.load_state_dict(state)
        rest = [as_np(x) for x in fresh]
        assert len(rest) == len(want) - 2
        for x, y in zip(rest, want[2:]):
            same(x, y)


def test_text_batches(text_file):
    loader = ferrofeed.text(text_file, batch_size=16, max_length=24)
    b = next(iter(loader))
    assert set(b) == {"input_ids", "attention_mask", "indices"}
    assert b["input_ids"].dtype == torch.int64 and b["input_ids"].shape[0] == 16
    assert b["input_ids"].shape == b["attention_mask"].shape and b["input_ids"].shape[1] <= 24
    assert len(loader) == 13  # 200 lines


def test_audio_batches(audio_dir):
    loader = ferrofeed.audio(audio_dir, batch_size=4, chunk_seconds=1, n_mels=40, output="numpy")
    batches = list(loader)
    assert len(loader) == len(batches)  # WAV headers give the length
    assert {"features", "lengths", "chunk_starts", "indices"} <= set(batches[0])
    f = batches[0]["features"]
    assert f.dtype == np.float32 and f.shape[:2] == (4, 40)
    # 1.5+2+2.5+3+3.5 s in 1 s chunks, the last of each file padded: 2+2+3+3+4
    assert sum(len(b["indices"]) for b in batches) == 14
    assert [len(b["indices"]) for b in batches[:-1]] == [4] * (len(batches) - 1)


def test_audio_chunk_offsets_move_each_epoch_and_len_follows(audio_dir):
    loader = ferrofeed.audio(audio_dir, batch_size=1, chunk_seconds=1, chunk_offsets=4, seed=1,
                             shuffle=False, output="numpy")
    firsts = []
    for e in range(4):
        n = len(loader)  # the next epoch's length, from its offsets
        batches = list(loader)
        assert len(batches) == n, f"epoch {e}"
        starts = {}
        for b in batches:
            starts.setdefault(int(b["indices"][0]) >> 40, []).append(int(b["chunk_starts"][0]))
        # 1 s at 16 kHz: offsets of 0, 4000, 8000 or 12000 samples.
        assert all(s[0] in (0, 4000, 8000, 12000) for s in starts.values()), starts
        firsts.append(tuple(s[0] for _, s in sorted(starts.items())))
    assert len(set(firsts)) > 1, "the offsets did not move between epochs"
    with pytest.raises(ValueError) as e:
        ferrofeed.audio(audio_dir, chunk_offsets=0)
    assert "chunk-offsets" in str(e.value) or "chunk_offsets" in str(e.value)


def test_a_long_audio_file_read_as_segments_gives_the_chunks_of_reading_it_whole(tmp_path):
    # 40 s of 16 kHz noise: 1.28 MB, over the 1 MiB a file needs to be split.
    rng = np.random.default_rng(3)
    pcm = (rng.standard_normal(16000 * 40 + 99) * 6000).clip(-32768, 32767).astype("<i2")
    with wave.open(str(tmp_path / "long.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())

    def chunks(**kw):
        loader = ferrofeed.audio(str(tmp_path), batch_size=4, chunk_seconds=2, workers=2, seed=4,
                                 chunk_offsets=2, output="numpy", **kw)
        got = {}
        for b in loader:
            for row, start in enumerate(b["chunk_starts"]):
                got[int(start)] = (b["features"][row].copy(), int(b["lengths"][row]))
        return got, len(loader)

    whole, _ = chunks(segment_seconds=0)
    split, n = chunks(segment_seconds=6)
    assert len(whole) >= 19 and sorted(split) == sorted(whole)
    assert all(np.array_equal(split[k][0], whole[k][0]) and split[k][1] == whole[k][1] for k in whole)
    with pytest.raises(ValueError) as e:
        ferrofeed.audio(str(tmp_path), segment_seconds=-1)
    assert "segment" in str(e.value)


def test_rank_and_world_size_from_torchrun_env(vision_dir, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    r1 = ferrofeed.vision(vision_dir, batch_size=4, seed=0, transform="eval", size=32, resize=40)
    monkeypatch.setenv("RANK", "0")
    r0 = ferrofeed.vision(vision_dir, batch_size=4, seed=0, transform="eval", size=32, resize=40)
    i0 = torch.cat([b["indices"] for b in r0]).tolist()
    i1 = torch.cat([b["indices"] for b in r1]).tolist()
    assert len(r0) == len(r1) == 3
    assert len(i0) == len(i1) == 12 and not set(i0) & set(i1)
    assert sorted(i0 + i1) == list(range(24))


def test_report_has_the_report_json_fields(vision_dir):
    loader = ferrofeed.vision(vision_dir, batch_size=8, transform="eval", size=32, resize=40)
    assert loader.report() is None
    for _ in loader:
        pass
    r = loader.report()
    for k in ("samples", "batches", "skipped", "stages", "bottleneck", "data_stall_seconds", "peak_bytes_in_flight"):
        assert k in r, k
    assert r["samples"] == 24 and r["batches"] == 3 and r["domain"] == "vision"


def test_a_corrupt_sample_under_fail_raises_sample_error(corrupt_vision_dir):
    loader = ferrofeed.vision(corrupt_vision_dir, batch_size=4, shuffle=False)
    with pytest.raises(ferrofeed.SampleError) as e:
        for _ in loader:
            pass
    err = e.value
    assert isinstance(err, RuntimeError)
    assert err.index == 8 and err.path.endswith(os.path.join("class1", "img0.jpg")) and err.stage == "decode"


def test_a_corrupt_sample_under_skip_is_reported(corrupt_vision_dir):
    loader = ferrofeed.vision(corrupt_vision_dir, batch_size=4, on_error="skip")
    n = sum(len(b["indices"]) for b in loader)
    assert n == 23
    (s,) = loader.report()["skipped"]
    assert s["index"] == 8 and s["stage"] == "decode" and s["path"].endswith("img0.jpg")


def test_a_corrupt_sample_under_retry_then_fail(corrupt_vision_dir):
    loader = ferrofeed.vision(corrupt_vision_dir, batch_size=4, on_error="retry:2")
    with pytest.raises(ferrofeed.SampleError):
        list(loader)


@pytest.mark.parametrize(
    "options, exc, named",
    [
        (dict(batch_sise=4), TypeError, "batch_sise"),
        (dict(batch_size="four"), ValueError, "batch_size"),
        (dict(batch_size=0), ValueError, "batch"),
        (dict(batch_size=[4]), TypeError, "batch_size"),
        (dict(shuffle="maybe"), TypeError, "shuffle"),
        (dict(autotune="yes"), TypeError, "autotune"),
        (dict(transform="rotate"), ValueError, "transform"),
        (dict(workers=0), ValueError, "workers"),
        (dict(max_bytes_in_flight="lots"), ValueError, "max_bytes_in_flight"),
        (dict(on_error="ignore"), ValueError, "on_error"),
        (dict(rank=3, world_size=2), ValueError, "rank"),
        (dict(output="jax"), ValueError, "output"),
        (dict(device="tpu"), ValueError, "device"),
        (dict(pin_memory="always"), ValueError, "pin_memory"),
        (dict(dump="out"), ValueError, "dump"),
        (dict(size=1 << 20), ValueError, "size"),
    ],
)
def test_bad_options_name_the_argument(vision_dir, options, exc, named):
    with pytest.raises(exc) as e:
        ferrofeed.vision(vision_dir, **options)
    assert named in str(e.value)


def test_a_missing_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        ferrofeed.vision(tmp_path / "nope")
    assert "nope" in str(e.value)
    with pytest.raises(TypeError):
        ferrofeed.text(42)


def test_max_bytes_in_flight_takes_an_int_or_a_size(vision_dir):
    for v in (64 << 20, "64MiB"):
        loader = ferrofeed.vision(vision_dir, batch_size=8, max_bytes_in_flight=v, transform="eval", size=32, resize=40)
        assert sum(1 for _ in loader) == 3
        assert loader.report()["max_bytes_in_flight"] == 64 << 20


def threads():
    return len(os.listdir("/proc/self/task"))


def test_deleting_a_loader_mid_epoch_joins_its_threads(vision_dir):
    before = threads()
    for _ in range(3):
        loader = ferrofeed.vision(vision_dir, batch_size=2, workers=2)
        it = iter(loader)
        next(it)
        del it, loader
        gc.collect()
    deadline = time.time() + 5
    while threads() > before and time.time() < deadline:
        time.sleep(0.05)
    assert threads() <= before


def test_the_gil_is_released_while_waiting(vision_dir):
    loader = ferrofeed.vision(vision_dir, batch_size=24, transform="train", size=768, workers=1)
    ticks = [0]
    done = threading.Event()

    def count():
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    time.sleep(0.01)
    t0, start = time.time(), ticks[0]
    next(iter(loader))
    waited, during = time.time() - t0, ticks[0] - start
    done.set()
    t.join()
    # The counter sleeps 1 ms a tick: holding the GIL would stall it for
    # the whole wait.
    assert waited > 0.02 and during >= waited / 0.001 / 10, (waited, during)


def test_keyboard_interrupt_reaches_the_caller_while_waiting(vision_dir):
    import _thread

    loader = ferrofeed.vision(vision_dir, batch_size=24, transform="train", size=512, workers=1, max_bytes_in_flight="1GiB")
    it = iter(loader)
    timer = threading.Timer(0.02, _thread.interrupt_main)
    t0 = time.time()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in range(1000):
            next(it)
            it = iter(loader)
    assert time.time() - t0 < 5
    loader.close()


def test_the_wait_is_a_torch_profiler_range(vision_dir):
    loader = ferrofeed.vision(vision_dir, batch_size=8, transform="eval", size=32, resize=40)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in loader:
            pass
    names = {e.key for e in prof.key_averages()}
    assert "ferrofeed: wait for batch" in names


def test_options_lists_every_flag():
    o = ferrofeed.options("vision")
    for k in ("batch_size", "transform", "size", "seed", "shuffle", "workers", "max_bytes_in_flight",
              "on_error", "rank", "world_size", "drop_last", "output", "pin_memory", "device"):
        assert k in o, k
    assert o["autotune"] is False and o["batch_size"] is True
    assert "max_tokens" in ferrofeed.options("text") and "chunk_seconds" in ferrofeed.options("audio")


@pytest.mark.parametrize("domain", ["vision", "text", "audio"])
def test_pinned_buffers_when_cuda_is_there(domain, vision_dir, text_file, audio_dir):
    path = {"vision": vision_dir, "text": text_file, "audio": audio_dir}[domain]
    opts = {"vision": dict(size=320), "text": dict(max_length=512), "audio": dict(chunk_seconds=1)}[domain]
    loader = ferrofeed.Loader(domain, path, batch_size=64, pin_memory=True, **opts)
    b = next(iter(loader))
    big = max(b.values(), key=lambda t: t.numel() * t.element_size())
    assert big.is_pinned() == torch.cuda.is_available()
    off = ferrofeed.Loader(domain, path, batch_size=64, pin_memory=False, **opts)
    assert not max(next(iter(off)).values(), key=lambda t: t.numel()).is_pinned()


def test_a_cuda_device_needs_one():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError) as e:
        ferrofeed.text(device="cuda")
    assert "device" in str(e.value)


@pytest.mark.parametrize("domain", ["vision", "text", "audio"])
def test_every_option_refuses_a_wrong_type_by_name(domain):
    for name, takes_value in ferrofeed.options(domain).items():
        bad = object() if takes_value else "yes"
        with pytest.raises(TypeError) as e:
            ferrofeed.Loader(domain, None, **{name: bad})
        assert name in str(e.value), (name, str(e.value))
