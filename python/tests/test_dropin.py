"""ferrofeed.torch.DataLoader against torch's own DataLoader (PYTHON.md,
"ferrofeed.torch.DataLoader")."""

import gc
import json
import os
import threading
import time

import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

from ferrofeed.torch import DataLoader  # noqa: E402


class Squares(tud.Dataset):
    def __init__(self, n=50):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"x": torch.full((3,), float(i)), "y": i * i}


class Raises(Squares):
    def __getitem__(self, i):
        if i == 7:
            raise KeyError(f"no sample {i}")
        return super().__getitem__(i)


def flat(batches):
    out = []
    for b in batches:
        if isinstance(b, dict):
            out.append({k: v.tolist() if hasattr(v, "tolist") else v for k, v in b.items()})
        elif isinstance(b, torch.Tensor):
            out.append(b.tolist())
        else:
            out.append(b)
    return out


CASES = [
    dict(batch_size=4),
    dict(batch_size=4, drop_last=True),
    dict(batch_size=5, shuffle=True),
    dict(batch_size=None),
    dict(batch_size=3, sampler=list(range(49, -1, -3))),
    dict(batch_sampler=[[1, 2], [40, 3, 9], [0]]),
    dict(batch_size=4, sampler=tud.RandomSampler(range(50), replacement=True, num_samples=17)),
    dict(batch_size=4, collate_fn=lambda xs: [x["y"] for x in xs]),
]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_same_batches_as_torch(case, workers):
    kw = dict(CASES[case])
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    if isinstance(kw.get("sampler"), tud.RandomSampler):
        kw["sampler"] = tud.RandomSampler(range(50), replacement=True, num_samples=17, generator=g1)
        kw2 = dict(kw, sampler=tud.RandomSampler(range(50), replacement=True, num_samples=17, generator=g2))
    else:
        kw2 = dict(kw)
    ours = DataLoader(Squares(), num_workers=workers, generator=g1, **kw)
    theirs = tud.DataLoader(Squares(), num_workers=0, generator=g2, **kw2)
    assert len(ours) == len(theirs)
    for _ in range(2):  # two epochs: the generator advances alike
        assert flat(ours) == flat(theirs)


@pytest.mark.parametrize(
    "kw",
    [
        dict(batch_sampler=[[0]], batch_size=2),
        dict(batch_sampler=[[0]], shuffle=True),
        dict(batch_sampler=[[0]], drop_last=True),
        dict(sampler=[0, 1], shuffle=True),
        dict(prefetch_factor=2),
        dict(num_workers=-1),
        dict(timeout=-1),
        dict(persistent_workers=True),
    ],
)
def test_argument_errors_are_torchs(kw):
    with pytest.raises(ValueError) as ours:
        DataLoader(Squares(), **kw)
    with pytest.raises(ValueError) as theirs:
        tud.DataLoader(Squares(), **kw)
    assert str(ours.value) == str(theirs.value)


class Shards(tud.IterableDataset):
    """Self-sharding the standard way: each worker takes its slice."""

    def __init__(self, n=30):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        info = tud.get_worker_info()
        lo, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(lo, self.n, step):
            yield torch.tensor([i])


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_iterable_datasets_shard_themselves_and_interleave_as_torch(workers):
    ours = flat(DataLoader(Shards(), batch_size=4, num_workers=workers))
    theirs = flat(tud.DataLoader(Shards(), batch_size=4, num_workers=workers))
    assert ours == theirs
    assert sorted(x for b in ours for row in b for x in row) == list(range(30))


def test_worker_info_and_init_fn_in_each_worker_thread():
    seen = []
    lock = threading.Lock()

    class Who(Squares):
        def __getitem__(self, i):
            info = tud.get_worker_info()
            with lock:
                seen.append((info.id, info.num_workers, threading.get_ident()))
            time.sleep(0.005)  # long enough that both workers take work
            return i

    inits = []
    loader = DataLoader(Who(40), batch_size=4, num_workers=2, worker_init_fn=lambda w: inits.append(w))
    assert sorted(x for b in loader for x in b.tolist()) == list(range(40))
    # Once in each worker thread, before its first sample.
    assert sorted(inits) == [0, 1] == sorted({w for w, _, _ in seen})
    ids = {}
    for wid, n, tid in seen:
        assert n == 2
        assert ids.setdefault(tid, wid) == wid, "one id per thread"
    assert tud.get_worker_info() is None  # the calling thread is not a worker


@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_exceptions_keep_their_type(workers):
    loader = DataLoader(Raises(), batch_size=4, num_workers=workers)
    with pytest.raises(KeyError) as e:
        list(loader)
    assert "no sample 7" in str(e.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_policy_reports_the_sample(workers):
    loader = DataLoader(Raises(), batch_size=4, num_workers=workers, on_error="skip")
    got = [y for b in loader for y in b["y"].tolist()]
    assert got == [i * i for i in range(50) if i != 7]
    (s,) = loader.report()["skipped"]
    assert s["index"] == 7
    r = loader.report()
    for k in ("getitem_seconds", "collate_seconds", "data_stall_seconds"):
        assert k in r and r[k] >= 0


@pytest.mark.parametrize("workers", [0, 2])
def test_bad_samples_fail_as_default_collate_fails(workers):
    class Nones(Squares):
        def __getitem__(self, i):
            return None

    class Ragged(Squares):
        def __getitem__(self, i):
            return torch.zeros(i + 1)

    for ds in (Nones(), Ragged()):
        with pytest.raises((TypeError, RuntimeError)) as ours:
            list(DataLoader(ds, batch_size=4, num_workers=workers))
        with pytest.raises((TypeError, RuntimeError)) as theirs:
            list(tud.DataLoader(ds, batch_size=4))
        assert type(ours.value) is type(theirs.value)


def test_out_of_range_indices_raise_the_datasets_error():
    with pytest.raises(IndexError):
        list(DataLoader(Squares(10), batch_sampler=[[1, 2], [99]], num_workers=2))


def test_an_empty_dataset_gives_no_batches():
    for w in (0, 2):
        loader = DataLoader(Squares(0), batch_size=4, num_workers=w)
        assert len(loader) == 0 and list(loader) == []


def test_a_hanging_dataset_times_out():
    class Hangs(Squares):
        def __getitem__(self, i):
            if i == 2:
                time.sleep(3)
            return i

    loader = DataLoader(Hangs(8), batch_size=2, num_workers=2, timeout=0.3)
    t0 = time.time()
    with pytest.raises(RuntimeError) as e:
        list(loader)
    assert "timed out" in str(e.value) and time.time() - t0 < 3
    loader.close()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("k", [0, 3, 10, 13])
def test_state_dict_resumes_exactly(workers, k):
    def make():
        return DataLoader(Squares(50), batch_size=4, shuffle=True, num_workers=workers,
                          generator=torch.Generator().manual_seed(11))

    whole = make()
    epochs = [flat(whole) for _ in range(3)]
    want = epochs[0] + epochs[1]
    part = make()
    it = iter(part)
    for _ in range(k):
        next(it)
    state = json.loads(json.dumps(part.state_dict()))
    del it, part
    fresh = make()
    fresh.load_state_dict(state)
    rest = flat(fresh) + flat(fresh)
    if k == 13:
        # Taken after the 13-batch epoch's last batch, before its loop ended:
        # the next loop is epoch 1 (not an empty rest of epoch 0).
        assert rest == epochs[1] + epochs[2]
    else:
        assert len(rest) == len(want) - k and rest == want[k:]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_end_of_epoch_state_starts_the_next_epoch(workers):
    def make():
        return DataLoader(Squares(50), batch_size=8, shuffle=True, num_workers=workers,
                          generator=torch.Generator().manual_seed(5))

    whole = make()
    e0, e1 = flat(whole), flat(whole)
    part = make()
    assert flat(part) == e0
    state = part.state_dict()
    assert state["epoch"] == 1 and state["batches"] == 0
    fresh = make()
    fresh.load_state_dict(state)
    assert flat(fresh) == e1


def test_breaking_out_and_deleting_mid_epoch_join_threads():
    before = len(os.listdir("/proc/self/task"))
    loader = DataLoader(Squares(200), batch_size=2, num_workers=2)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    assert len(list(loader)) == 100  # the next epoch, whole
    it = iter(loader)
    next(it)
    del it, loader
    gc.collect()
    deadline = time.time() + 5
    while len(os.listdir("/proc/self/task")) > before and time.time() < deadline:
        time.sleep(0.05)
    assert len(os.listdir("/proc/self/task")) <= before


def test_keyboard_interrupt_while_waiting():
    import _thread

    class Slow(Squares):
        def __getitem__(self, i):
            time.sleep(0.5)
            return i

    loader = DataLoader(Slow(20), batch_size=4, num_workers=2)
    threading.Timer(0.1, _thread.interrupt_main).start()
    t0 = time.time()
    with pytest.raises(KeyboardInterrupt):
        list(loader)
    assert time.time() - t0 < 2
    loader.close()


def test_in_order_false_yields_every_batch():
    class Uneven(Squares):
        def __getitem__(self, i):
            time.sleep(0.02 if i < 4 else 0)
            return i

    got = [b.tolist() for b in DataLoader(Uneven(16), batch_size=4, num_workers=2, in_order=False)]
    assert sorted(got) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]


def test_max_bytes_in_flight_bounds_what_is_held():
    class Big(Squares):
        def __getitem__(self, i):
            return torch.zeros(1 << 18)  # 1 MiB

    loader = DataLoader(Big(64), batch_size=2, num_workers=2, max_bytes_in_flight=8 << 20)
    assert sum(len(b) for b in loader) == 64
    r = loader.report()
    assert r["peak_bytes_in_flight"] <= (8 << 20) + (4 << 20), r["peak_bytes_in_flight"]


def _worker_info_seen(loader_cls, workers):
    class Info(tud.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            info = tud.get_worker_info()
            return {
                "repr_keys": [kv.split("=")[0] for kv in repr(info)[len("WorkerInfo("):-1].split(", ")],
                "type": type(info).__name__,
                "dataset_is_ours": isinstance(info.dataset, Info),
                "frozen": _assign_fails(info),
            }

    loader = loader_cls(Info(), batch_size=None, num_workers=workers)
    return next(iter(loader))


def _assign_fails(info):
    try:
        info.id = 99
    except Exception:
        return True
    return False


def test_worker_info_is_torchs_own_with_the_same_fields_and_repr():
    want = _worker_info_seen(tud.DataLoader, 1)
    got = _worker_info_seen(DataLoader, 2)
    assert got == want, (got, want)
    assert "dataset" in got["repr_keys"]


@pytest.mark.parametrize("attr", ["batch_size", "sampler", "batch_sampler", "drop_last", "dataset"])
def test_assigning_what_defines_the_epochs_after_construction_raises_as_torch(attr):
    ds = Squares(10)
    for cls in (tud.DataLoader, DataLoader):
        loader = cls(ds, batch_size=2)
        with pytest.raises(ValueError, match=f"{attr} attribute should not be set"):
            setattr(loader, attr, getattr(loader, attr))
    # Anything else may still be set.
    ours = DataLoader(ds, batch_size=2)
    ours.num_workers = 0
    ours.timeout = 5


_EXIT_MID_EPOCH = """
import torch, torch.utils.data as tud
from ferrofeed.torch import DataLoader
class D(tud.Dataset):
    def __len__(self): return 400
    def __getitem__(self, i):
        return torch.full((3,), float(i))
it = iter(DataLoader(D(), batch_size=4, num_workers=2))
next(it)
"""


def test_the_interpreter_exits_cleanly_with_an_epoch_in_progress():
    import subprocess
    import sys

    # The workers were still calling __getitem__ while the interpreter
    # finalized: the process aborted (134) in about half the runs.
    for _ in range(6):
        r = subprocess.run([sys.executable, "-c", _EXIT_MID_EPOCH], capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()[-2000:]


class Bulk(tud.Dataset):
    """``__getitem__`` takes a list of indices and loads them at once."""

    def __len__(self):
        return 12

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return torch.tensor([float(i) for i in idx])
        return torch.tensor(float(idx))


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_size_none_with_a_sampler_of_lists_passes_each_list_whole(workers):
    sampler = tud.BatchSampler(tud.SequentialSampler(range(12)), batch_size=4, drop_last=False)
    want = [b.tolist() for b in tud.DataLoader(Bulk(), batch_size=None, sampler=sampler)]
    got = [b.tolist() for b in DataLoader(Bulk(), batch_size=None, sampler=sampler, num_workers=workers)]
    assert got == want == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]]


class FailsAt(tud.Dataset):
    """``__getitem__`` raises ValueError at the indices in ``bad``."""

    def __init__(self, n=24, bad=(7, 13)):
        self.n, self.bad = n, set(bad)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise ValueError(f"sample {i} is broken")
        return torch.tensor(float(i))


def _observe(loader):
    """What a loop that catches each batch's error and goes on sees."""
    seen, it = [], iter(loader)
    while True:
        try:
            b = next(it)
        except StopIteration:
            return seen
        except Exception as e:
            seen.append(("error", type(e).__name__, str(e).splitlines()[0]))
        else:
            seen.append(("batch", b.tolist()))


@pytest.mark.parametrize("workers", [0, 2, 4])
def test_after_a_batch_raises_the_iterator_goes_on_as_torchs(workers):
    def make(cls):
        g = torch.Generator().manual_seed(3)
        return cls(FailsAt(), batch_size=4, shuffle=True, generator=g, num_workers=workers)

    want = _observe(make(tud.DataLoader))
    got = _observe(make(DataLoader))
    assert [x[:2] for x in got] == [x[:2] for x in want]
    assert sum(x[0] == "error" for x in got) == 2
    assert sum(x[0] == "batch" for x in got) == 4
    for g_, w_ in zip(got, want):
        if g_[0] == "error":
            if workers == 0:
                assert g_[2] == w_[2] == g_[2]
            else:
                # torch: "Caught ValueError in DataLoader worker process 1."
                assert g_[2].startswith("Caught ValueError in DataLoader worker"), g_
                assert w_[2].startswith("Caught ValueError in DataLoader worker"), w_


_worker_local = threading.local()


def _init_worker_local(wid):
    _worker_local.wid = wid
    _worker_local.handle = object()  # e.g. a file handle or a connection


class SeesWorkerLocal(tud.Dataset):
    def __len__(self):
        return 48

    def __getitem__(self, i):
        return (getattr(_worker_local, "wid", None), tud.get_worker_info().id, hasattr(_worker_local, "handle"))


@pytest.mark.parametrize("workers", [2, 4])
def test_worker_init_fn_state_in_a_thread_local_is_what_that_workers_getitem_sees(workers):
    def seen(cls):
        loader = cls(SeesWorkerLocal(), batch_size=4, num_workers=workers, worker_init_fn=_init_worker_local,
                     collate_fn=lambda x: x)
        return [s for b in loader for s in b]

    for cls in (tud.DataLoader, DataLoader):
        rows = seen(cls)
        assert len(rows) == 48
        assert all(local == wid and handle for local, wid, handle in rows), (cls, rows)


class SlowAt(tud.Dataset):
    """Sample ``slow`` takes 0.4 s, so batches come out of order."""

    def __init__(self, n=24, slow=8):
        self.n, self.slow = n, slow

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.slow:
            time.sleep(0.4)
        return torch.tensor(i)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_in_order_false_resumes_exactly_what_was_not_delivered(k):
    def make():
        return DataLoader(SlowAt(), batch_size=2, num_workers=2, in_order=False,
                          generator=torch.Generator().manual_seed(1), shuffle=True)

    first = make()
    it = iter(first)
    before = [next(it).tolist() for _ in range(k)]
    state = json.loads(json.dumps(first.state_dict()))
    del it, first
    resumed = make()
    resumed.load_state_dict(state)
    after = [b.tolist() for b in resumed]
    got = sorted(x for b in before + after for x in b)
    assert got == list(range(24)), (before, after, state)


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("batch_size", [1, 2])
def test_in_order_false_a_slow_sample_holds_back_no_other_workers_batches(workers, batch_size):
    """torch's workers deliver their batches while one sits on a slow
    sample; so do the drop-in's (the slow batch comes among the last)."""

    class FirstIsSlow(tud.Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, i):
            if i == 0:
                time.sleep(1.0)
            return torch.tensor(i)

    def order(cls):
        loader = cls(FirstIsSlow(), batch_size=batch_size, num_workers=workers, in_order=False)
        return [b.reshape(-1).tolist() for b in loader]

    n = 24 // batch_size
    for cls in (tud.DataLoader, DataLoader):
        got = order(cls)
        assert sorted(got) == [list(range(i, i + batch_size)) for i in range(0, 24, batch_size)], cls
        slow = next(p for p, b in enumerate(got) if 0 in b)
        # torch: the slow worker also holds the batches it was handed
        # beforehand (prefetch_factor of them).
        assert slow >= n - 2 * workers, (cls, got)
    assert order(DataLoader)[-1][0] == 0
