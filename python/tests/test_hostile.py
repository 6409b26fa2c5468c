"""Hostile input from Python, round two: what the package got wrong for a
realistic but hostile user — a resume under other settings, a limit of
zero batches, a fork after creating a loader, and the drop-in's ``skip``
policy dropping good samples."""

import json
import os
import signal

import pytest

import ferrofeed

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

from ferrofeed.torch import DataLoader  # noqa: E402


def test_load_state_dict_with_another_batch_size_is_refused_by_name(vision_dir):
    opts = dict(seed=5, transform="eval", size=16, resize=16)
    first = ferrofeed.vision(vision_dir, batch_size=4, **opts)
    it = iter(first)
    next(it)
    next(it)
    state = json.loads(json.dumps(first.state_dict()))
    del it, first
    for other in (dict(batch_size=8), dict(batch_size=2), dict(batch_size=4, shuffle=False)):
        loader = ferrofeed.vision(vision_dir, **{**opts, **other})
        with pytest.raises(ValueError, match="batch_size|shuffle"):
            loader.load_state_dict(state)
    same = ferrofeed.vision(vision_dir, batch_size=4, **opts)
    same.load_state_dict(state)
    rest = [int(i) for b in same for i in b["indices"]]
    assert len(rest) == 24 - 8


def test_limit_batches_zero_delivers_nothing_and_len_follows_the_limit(vision_dir, text_file):
    for loader in (
        ferrofeed.vision(vision_dir, batch_size=4, limit_batches=0),
        ferrofeed.text(text_file, batch_size=4, limit_batches=0),
    ):
        assert list(loader) == []
        assert len(loader) == 0
    capped = ferrofeed.vision(vision_dir, batch_size=4, limit_batches=2)
    assert len(capped) == 2
    assert len(list(capped)) == 2


def _in_child(fn):
    """Runs ``fn`` in a forked child; its exit code (124 if it hung)."""
    pid = os.fork()
    if pid == 0:  # the child
        signal.alarm(20)
        code = 1
        try:
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 124 if os.WTERMSIG(status) == signal.SIGALRM else 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def test_a_loader_used_after_fork_raises_a_clear_error_in_the_child(vision_dir):
    loader = ferrofeed.vision(vision_dir, batch_size=4, transform="eval", size=16)
    it = iter(loader)
    next(it)  # forked mid-epoch

    def child():
        try:
            next(it)
        except RuntimeError as e:
            if "os.fork()" not in str(e):
                return 3
        else:
            return 2
        try:
            iter(loader)
        except RuntimeError as e:
            return 0 if "os.fork()" in str(e) else 4
        return 5

    assert _in_child(child) == 0
    # The parent's loader goes on.
    assert sum(1 for _ in it) == 5


def test_a_dropin_loader_used_after_fork_raises_a_clear_error_in_the_child():
    ds = tud.TensorDataset(torch.arange(40.0))
    loader = DataLoader(ds, batch_size=4, num_workers=2)
    assert len(list(loader)) == 10

    def child():
        try:
            list(loader)
        except RuntimeError as e:
            return 0 if "os.fork()" in str(e) else 3
        return 2

    assert _in_child(child) == 0
    assert len(list(loader)) == 10


class NoneAt(tud.Dataset):
    """``__getitem__`` has nothing (returns None) for the indices in ``bad``."""

    def __init__(self, n=12, bad=(5,), shape_at=()):
        self.n, self.bad, self.shape_at = n, set(bad), set(shape_at)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            return None
        if i in self.shape_at:
            return torch.full((4,), float(i))
        return torch.full((3,), float(i))


@pytest.mark.parametrize("workers", [0, 2])
def test_dropin_skip_drops_only_the_bad_samples(workers):
    for ds, bad in [
        (NoneAt(bad=(5,)), [5]),
        (NoneAt(bad=(0,)), [0]),
        (NoneAt(bad=(), shape_at=(4,)), [4]),
        (NoneAt(bad=(), shape_at=(0, 9)), [0, 9]),
    ]:
        loader = DataLoader(ds, batch_size=4, num_workers=workers, on_error="skip")
        got = sorted(int(x[0]) for b in loader for x in b)
        assert got == [i for i in range(12) if i not in bad], (workers, bad)
        skipped = sorted(e["index"] for e in loader.report()["skipped"])
        assert skipped == bad, (workers, bad, loader.report()["skipped"])


@pytest.mark.parametrize("workers", [0, 2])
def test_dropin_fail_raises_torchs_own_collate_error(workers):
    with pytest.raises(Exception) as want:
        list(tud.DataLoader(NoneAt(bad=(5,)), batch_size=4, num_workers=workers))
    with pytest.raises(want.type):
        list(DataLoader(NoneAt(bad=(5,)), batch_size=4, num_workers=workers))


def test_each_iter_is_the_next_epoch_and_an_older_iterator_says_so(vision_dir):
    loader = ferrofeed.vision(vision_dir, batch_size=4, transform="eval", size=16, seed=1)
    first = iter(loader)
    second = iter(loader)  # epoch 1; epoch 0 was ended
    with pytest.raises(RuntimeError, match="later iter"):
        next(first)
    got = [b["indices"].tolist() for b in second]
    fresh = ferrofeed.vision(vision_dir, batch_size=4, transform="eval", size=16, seed=1)
    assert got == [b["indices"].tolist() for b in fresh.epoch(1)]


def test_a_second_thread_iterating_gets_a_clear_error(vision_dir):
    import threading

    loader = ferrofeed.vision(vision_dir, batch_size=4, transform="eval", size=16)
    it = iter(loader)
    errors = []
    inside = threading.Event()
    release = threading.Event()

    held = loader._busy
    # Hold the loader as a `next()` in progress would.
    assert held.acquire(blocking=False)

    def other():
        inside.set()
        try:
            next(it)
        except RuntimeError as e:
            errors.append(str(e))
        release.set()

    t = threading.Thread(target=other)
    t.start()
    assert release.wait(10)
    t.join()
    held.release()
    assert errors and "another thread" in errors[0]
    assert len(list(it)) == 6


def test_numbers_given_as_text_and_zero_epochs_are_refused(vision_dir):
    with pytest.raises(ValueError, match="batch_size: invalid type: string"):
        ferrofeed.vision(vision_dir, batch_size="64")
    with pytest.raises(ValueError, match="epochs"):
        ferrofeed.vision(vision_dir, epochs=0)
    # Sizes take units as text.
    loader = ferrofeed.vision(vision_dir, batch_size=8, max_bytes_in_flight="64MiB")
    assert len(list(loader)) == 3
