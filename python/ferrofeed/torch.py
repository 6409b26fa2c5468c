"""``ferrofeed.torch.DataLoader``: a drop-in for ``torch.utils.data.DataLoader``
that runs any Dataset on threads instead of processes.

One changed import::

    from ferrofeed.torch import DataLoader
    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2)

Arguments are checked by torch's own ``DataLoader`` constructor (same
errors), and batches are drawn from torch's own samplers and collated by
torch's ``default_collate`` (or your ``collate_fn``), so the batches equal
torch's for the same arguments. ``num_workers=N`` runs ``N`` worker threads
— for a map-style dataset on ferrofeed's engine (byte budget, error policy,
per-stage timing, data-stall figure) — and ``0`` runs in the calling thread.
No process is forked: no per-worker copies of the dataset, no ``/dev/shm``,
no respawns. Work that holds the GIL (pure-Python transforms) does not run
in parallel; Pillow, numpy and torch release it in their kernels.

Extras: ``on_error="fail"|"skip"|"retry:N"``, ``max_bytes_in_flight``,
``report()`` and exact ``state_dict()``/``load_state_dict()``.
"""

from __future__ import annotations

import atexit
import base64
import copy
import itertools
import operator
import os
import queue
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import torch
import torch.utils.data as tud
from torch.utils.data import IterableDataset

from . import _ferrofeed

__all__ = ["DataLoader", "WorkerInfo"]

_DEFAULT_BUDGET = 1 << 30


def WorkerInfo(id: int, num_workers: int, seed: int, dataset: Any) -> Any:
    """What ``torch.utils.data.get_worker_info()`` returns inside a worker
    thread: torch's own ``WorkerInfo`` (same attributes, same repr, same
    immutability) with ``id``, ``num_workers``, ``seed`` and ``dataset``,
    and ``worker_method="thread"`` where torch's has that field."""
    cls = tud._utils.worker.WorkerInfo
    fields = getattr(cls, "__dataclass_fields__", None)
    kw: Dict[str, Any] = dict(id=id, num_workers=num_workers, seed=seed, dataset=dataset)
    if fields is not None and "worker_method" in fields:
        kw["worker_method"] = "thread"
    return cls(**kw)


# Worker info by OS thread. Not a threading.local: the engine's threads
# enter Python afresh for each call, and a thread-local would not last.
_infos: Dict[int, Any] = {}
_torch_get_worker_info = tud.get_worker_info


def _get_worker_info() -> Optional[Any]:
    info = _infos.get(threading.get_ident())
    return info[0] if info is not None else _torch_get_worker_info()


def _install_worker_info() -> None:
    # get_worker_info() reads a process-wide global in torch; inside
    # ferrofeed's worker threads it answers for the calling thread.
    tud.get_worker_info = _get_worker_info
    tud._utils.worker.get_worker_info = _get_worker_info
    if hasattr(tud, "dataloader"):
        tud.dataloader.get_worker_info = _get_worker_info


_install_worker_info()


def _nbytes(obj: Any) -> int:
    """Bytes a sample holds (tensors, arrays, bytes, nested containers)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    nb = getattr(obj, "nbytes", None)
    if isinstance(nb, int):
        return nb
    if isinstance(obj, (bytes, bytearray, str)):
        return len(obj)
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values()) + 64
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj) + 64
    return sys.getsizeof(obj)


def _gen_state(generator: Optional[torch.Generator]) -> str:
    s = generator.get_state() if generator is not None else torch.get_rng_state()
    return base64.b64encode(bytes(s.numpy().tobytes())).decode()


def _set_gen_state(generator: Optional[torch.Generator], text: str) -> None:
    t = torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
    if generator is not None:
        generator.set_state(t)
    else:
        torch.set_rng_state(t)


class _GoesOn:
    """An epoch of a map-style dataset that, as torch's iterator, goes on
    after a batch raises: ``next()`` raises that batch's error, and the
    following ``next()`` yields the batch after it. ``start(plan)`` runs
    the batches of ``plan`` in order; after an error the rest of the plan is
    started again."""

    def __init__(self, loader: "DataLoader", start: Callable[[List[Any]], Iterator[Any]], plan: List[Any]):
        self._loader = loader
        self._start = start
        self._plan = plan
        self._done = 0  # batches of the plan delivered or raised
        self._gen: Optional[Iterator[Any]] = start(plan)
        self._ended = False

    def __iter__(self) -> "_GoesOn":
        return self

    def __next__(self) -> Any:
        if self._ended:
            raise StopIteration
        if self._gen is None:
            self._gen = self._start(self._plan[self._done:])
        try:
            batch = next(self._gen)
        except StopIteration:
            self._ended = True
            raise
        except Exception:
            # This batch is spent: the next call starts after it.
            self._gen = None
            self._done += 1
            self._loader._yielded += 1
            if self._done >= len(self._plan):
                self._ended = True
                self._loader._finish_epoch({"batches": 0, "skipped": []})
            raise
        self._done += 1
        return batch


def _stateful(obj: Any) -> bool:
    """Whether ``obj`` keeps a state of its own (torchdata's ``Stateful``:
    ``state_dict()`` and ``load_state_dict(state)``)."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _is_index(x: Any) -> bool:
    """Whether ``x`` is an integer index (int, numpy or 0-d torch integer)."""
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def _signature(x: Any) -> Any:
    """What must agree between samples for them to collate: the structure,
    and the shape and dtype of every tensor or array in it."""
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.dtype)
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is not None and dtype is not None:
        return ("array", tuple(shape), str(dtype))
    if isinstance(x, dict):
        return ("dict", tuple((repr(k), _signature(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_signature(v) for v in x))
    return (type(x).__name__,)


def _blame(samples: List[Any], collate_fn: Callable[[List[Any]], Any]) -> Optional[int]:
    """The position of the sample a failed collate of ``samples`` is due to:
    the first ``None`` (a ``__getitem__`` that had nothing), else the first
    that fails to collate alone, else the first whose shapes differ from
    most of the batch's. ``None`` when no one sample is at fault."""
    for i, x in enumerate(samples):
        if x is None:
            return i
    if len(samples) < 2:
        return 0 if samples else None
    for i, x in enumerate(samples):
        try:
            collate_fn([x])
        except Exception:
            return i
    counts: Dict[Any, int] = {}
    sigs = []
    for x in samples:
        try:
            sig = _signature(x)
            hash(sig)
        except Exception:
            return None
        sigs.append(sig)
        counts[sig] = counts.get(sig, 0) + 1
    common = max(counts, key=lambda k: counts[k])  # ties: the first seen
    for i, sig in enumerate(sigs):
        if sig != common:
            return i
    return None


class _Work:
    """What worker threads run: ``__getitem__`` and collate, with each
    thread's worker setup. Kept apart from the loader so that the engine's
    references to it make no cycle (a deleted loader frees its threads)."""

    def __init__(self, loader: "DataLoader"):
        self.dataset = loader.dataset
        self.collate_fn = loader.collate_fn
        self.pin_memory = loader.pin_memory
        self.worker_init_fn = loader.worker_init_fn
        self.num_workers = loader.num_workers
        self.base_seed = 0
        self.token = object()
        # What the sampler yielded, when not indices (batch_size=None with a
        # sampler of lists: `dataset[list]`, bulk loading); the engine then
        # runs positions in this list.
        self.keys: Optional[List[Any]] = None
        # Errors re-raised as torch's workers' (not under "skip", whose
        # report keeps the sample's own error).
        self.name_worker = loader.num_workers > 0 and not loader._skip
        self.ids = itertools.count()
        self.lock = threading.Lock()

    def setup(self) -> None:
        me = threading.get_ident()
        known = _infos.get(me)
        if known is not None and known[1] is self.token:
            return
        with self.lock:
            wid = next(self.ids)
        _infos[me] = (WorkerInfo(wid, self.num_workers, self.base_seed + wid, self.dataset), self.token)
        if self.worker_init_fn is not None:
            self.worker_init_fn(wid)

    def _reraise_as_worker(self) -> None:
        """Raises the exception being handled as torch re-raises a worker's:
        the same type, with "Caught ValueError in DataLoader worker thread
        1." and the original traceback as its message."""
        info = _infos.get(threading.get_ident())
        where = "in DataLoader worker thread" + (f" {info[0].id}" if info is not None else "")
        torch._utils.ExceptionWrapper(where=where).reraise()

    def fetch(self, index: int):
        self.setup()
        keys = self.keys
        try:
            sample = self.dataset[index if keys is None else keys[index]]
        except Exception:
            if self.name_worker:
                self._reraise_as_worker()
            raise
        return sample, _nbytes(sample)

    def collate(self, samples: Any) -> Any:
        try:
            batch = self.collate_fn(samples)
        except Exception as e:
            # Names the sample at fault for the engine's error policy (it
            # drops that one under "skip", not the batch's first).
            if isinstance(samples, list):
                try:
                    e.__ferrofeed_sample__ = _blame(samples, self.collate_fn)  # type: ignore[attr-defined]
                except Exception:
                    pass
            if self.name_worker:
                try:
                    self._reraise_as_worker()
                except Exception as named:
                    if hasattr(e, "__ferrofeed_sample__"):
                        named.__ferrofeed_sample__ = e.__ferrofeed_sample__  # type: ignore[attr-defined]
                    raise named from None
            raise
        if self.pin_memory:
            batch = tud._utils.pin_memory.pin_memory(batch)
        return batch


# Loaders alive in this process: closed when the interpreter exits, before
# it finalizes, so that no worker thread is inside the dataset's code then
# (a thread calling into a finalizing interpreter aborts the process).
_live: "weakref.WeakSet[DataLoader]" = weakref.WeakSet()


@atexit.register
def _close_live_loaders() -> None:
    for loader in list(_live):
        try:
            loader._close()
        except Exception:
            pass


class DataLoader:
    """Drop-in for ``torch.utils.data.DataLoader`` on threads (see the module
    docs). Beyond torch's arguments: ``on_error`` (``"fail"``, ``"skip"``,
    ``"retry:N"``), ``max_bytes_in_flight`` (bytes of samples and batches in
    flight, default 1 GiB)."""

    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable[[List[Any]], Any]] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context: Any = None,
        generator: Optional[torch.Generator] = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        on_error: str = "fail",
        max_bytes_in_flight: Optional[int] = None,
        native: bool = False,
    ):
        # torch's constructor checks every argument and builds the samplers;
        # it starts no worker until iterated, and it is never iterated.
        self._torch = tud.DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        if not isinstance(on_error, str):
            raise TypeError(f"on_error: expected a str, got {type(on_error).__name__}")
        if max_bytes_in_flight is not None and (
            not isinstance(max_bytes_in_flight, int) or isinstance(max_bytes_in_flight, bool) or max_bytes_in_flight <= 0
        ):
            raise ValueError(f"max_bytes_in_flight: expected a positive int, got {max_bytes_in_flight!r}")
        self.dataset = dataset
        self.batch_size = self._torch.batch_size
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.collate_fn = self._torch.collate_fn
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.generator = generator
        self.prefetch_factor = self._torch.prefetch_factor
        self.in_order = in_order
        self.sampler = self._torch.sampler
        self.batch_sampler = self._torch.batch_sampler
        self._on_error = on_error
        self._skip = on_error == "skip" or on_error.endswith(":skip")
        self._budget = max_bytes_in_flight or _DEFAULT_BUDGET
        self._iterable = isinstance(dataset, IterableDataset)
        self._pid = os.getpid()
        self._runner: Optional[Any] = None
        self._threads: Optional[_IterWorkers] = None
        # Exact resume: the RNG state at the start of the current epoch and
        # the batches handed out since.
        self._epoch = 0
        self._yielded = 0
        self._epoch_rng = _gen_state(generator)
        self._resume: Optional[Dict[str, Any]] = None
        # in_order=False: the epoch's batches (places in its plan) delivered,
        # and those a resumed state had delivered.
        self._delivered: List[int] = []
        self._resume_delivered: Optional[List[int]] = None
        self._report: Dict[str, Any] = {}
        # Samplers that keep a state: theirs after each batch of the epoch
        # drawn (from batch `_snap_base` on), and the epoch's batch count.
        self._snaps: List[Dict[str, Any]] = []
        self._snap_base = 0
        self._plan_len = 0
        # Iterable datasets that keep a state: each worker's after the last
        # batch delivered, and which worker comes next.
        self._iter_state: Optional[Dict[str, Any]] = None
        self._warned_state = False
        # Worker ids are handed out once per thread for this loader's life
        # (its threads live across epochs, as with persistent_workers).
        self._work = _Work(self)
        self._token = self._work.token
        if num_workers > 0 and not self._iterable:
            # Checks the policy now, as a bad argument.
            self._runner = _ferrofeed.MapRunner(
                self._work.fetch,
                self._work.collate,
                self._torch._auto_collation,
                num_workers,
                max(1, self.prefetch_factor or 2) * num_workers,
                self._budget,
                in_order,
                on_error,
                float(timeout),
            )
        elif on_error not in ("fail", "skip") and not on_error.startswith("retry:"):
            raise ValueError(f"on_error: {on_error!r} is not fail, skip or retry:N")
        self.persistent_workers = persistent_workers
        # native=True: torchvision's ImageFolder and transforms as a native
        # pipeline (see ferrofeed._native).
        self._native: Optional[Any] = None
        if native:
            self._native = self._native_loader(sampler, batch_sampler, collate_fn, worker_init_fn)
        self._initialized = True
        _live.add(self)

    def _native_loader(self, sampler: Any, batch_sampler: Any, collate_fn: Any, worker_init_fn: Any) -> Any:
        from . import _native

        for name, given in (("sampler", sampler), ("batch_sampler", batch_sampler), ("collate_fn", collate_fn),
                            ("worker_init_fn", worker_init_fn)):
            if given is not None:
                raise ValueError(f"native=True: {name} does not translate (the native pipeline samples, "
                                 "shuffles and collates itself)")
        if self.batch_size is None:
            raise ValueError("native=True: batch_size=None does not translate")
        if self._iterable:
            raise ValueError("native=True: an IterableDataset does not translate")
        settings: Dict[str, Any] = {"on_error": self._on_error}
        if self._budget != _DEFAULT_BUDGET:
            settings["max_bytes_in_flight"] = self._budget
        return _native.loader(
            self.dataset,
            batch_size=self.batch_size,
            shuffle=isinstance(self._torch.sampler, tud.RandomSampler),
            drop_last=self.drop_last,
            num_workers=self.num_workers,
            generator=self.generator,
            pin_memory=self.pin_memory,
            settings=settings,
        )

    def _close(self) -> None:
        """Stops the epoch in progress and waits for its workers to leave
        the dataset's code."""
        if os.getpid() != self._pid:
            return
        if self._runner is not None:
            self._runner.close()
        if self._threads is not None:
            self._threads.close()
            self._threads = None

    # As torch's: these define the epochs, and changing one after
    # construction would leave the samplers drawn from the old value.
    _FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")

    def __setattr__(self, attr: str, val: Any) -> None:
        if self.__dict__.get("_initialized") and attr in self._FROZEN:
            raise ValueError(f"{attr} attribute should not be set after {type(self).__name__} is initialized")
        super().__setattr__(attr, val)

    # torch's rules for len(): batches for map-style datasets, the
    # dataset's length (with its batching) for iterable ones.
    def __len__(self) -> int:
        if self._native is not None:
            return len(self._native)
        return len(self._torch)

    def _stateful_samplers(self) -> Dict[str, Any]:
        """The samplers given that keep a state of their own
        (``state_dict``/``load_state_dict``, as torchdata's ``Stateful``)."""
        out: Dict[str, Any] = {}
        for name in ("sampler", "batch_sampler"):
            obj = getattr(self._torch, name, None)
            if _stateful(obj):
                out[name] = obj
        return out

    def _plan(self, samplers: Optional[Dict[str, Any]] = None) -> List[Any]:
        """Draws the epoch as torch's iterator does: the base seed first,
        then the sampler's order. Samplers that keep a state are given
        ``samplers`` first (they then yield the rest of their epoch) and
        their state is kept after each batch drawn, for ``state_dict()``."""
        self._work.base_seed = torch.empty((), dtype=torch.int64).random_(generator=self.generator).item()
        own = self._stateful_samplers()
        for name, st in (samplers or {}).items():
            if name in own:
                own[name].load_state_dict(st)
        if not own:
            self._snaps = []
            return list(self._torch._index_sampler)

        def snap() -> Dict[str, Any]:
            return {name: copy.deepcopy(obj.state_dict()) for name, obj in own.items()}

        plan = []
        snaps = [snap()]
        it = iter(self._torch._index_sampler)
        while True:
            try:
                b = next(it)
            except StopIteration:
                # After the epoch's end (a sampler may count epochs there).
                snaps[-1] = snap()
                break
            plan.append(b)
            snaps.append(snap())
        self._snaps = snaps
        return plan

    def __iter__(self) -> Iterator[Any]:
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"this DataLoader was created in process {self._pid}; after os.fork() its threads exist "
                "only there: create the DataLoader in this process (or fork before creating it)"
            )
        if self._native is not None:
            return ([b["images"], b["labels"]] for b in self._native)
        resumed: Optional[Dict[str, Any]] = None
        if self._resume is not None:
            resumed, self._resume = self._resume, None
            _set_gen_state(self.generator, resumed["rng"])
            self._epoch, skip = resumed["epoch"], resumed["batches"]
            self._resume_delivered = resumed.get("delivered")
        else:
            if self._yielded:  # the last epoch was left early
                self._epoch += 1
            skip = 0
        self._epoch_rng = _gen_state(self.generator)
        self._yielded = skip
        self._iter_state = None
        if self._iterable:
            restore = resumed.get("iterable") if resumed else None
            if restore is not None:
                self._iter_state = copy.deepcopy(restore)
            elif _stateful(self.dataset):
                # Each worker's dataset state at its start (a state taken
                # before any batch restores it, as torchdata's does).
                start = {"dataset": copy.deepcopy(self.dataset.state_dict()), "iter": None}
                n = max(1, self.num_workers)
                self._iter_state = {"workers": [copy.deepcopy(start) for _ in range(n)], "done": [False] * n, "next": 0}
            return self._iter_iterable(skip, restore)
        if resumed is not None and "dataset" in resumed and _stateful(self.dataset):
            self.dataset.load_state_dict(resumed["dataset"])
        samplers = resumed.get("samplers") if resumed else None
        if resumed is not None and resumed.get("finished"):
            # Taken after the epoch's last batch, before the loop ended: on
            # into the next epoch, as the loop that took it would have gone.
            self._plan(samplers)
            self._epoch += 1
            self._epoch_rng = _gen_state(self.generator)
            skip, samplers, self._resume_delivered = 0, None, None
            self._yielded = 0
        full = self._plan(samplers)
        # Samplers that keep a state yield only what was left; a plain one
        # is drawn whole and the delivered batches skipped.
        base = resumed.get("samplers_at", skip) if samplers and self._snaps and resumed else 0
        self._snap_base = base
        self._plan_len = base + len(full)
        if self._runner is not None and not self.in_order:
            # Out of order, a position is the set of batches delivered.
            done = set(self._resume_delivered or [])
            self._resume_delivered = None
            positions = [k for k in range(base, base + len(full)) if k not in done]
            self._delivered = sorted(done)
            self._yielded = len(done)
            return self._iter_engine([full[k - base] for k in positions], positions)
        plan = full[skip - base:]
        if self._runner is None:
            return _GoesOn(self, self._iter_inline, plan)
        return _GoesOn(self, self._iter_engine, plan)

    def _finish_epoch(self, extra: Dict[str, Any]) -> None:
        self._report = extra
        self._delivered = []
        # The next epoch is drawn from the samplers' state at this one's end.
        self._snaps = self._snaps[-1:]
        self._snap_base = 0
        self._plan_len = 0
        self._iter_state = None
        self._epoch += 1
        self._yielded = 0
        self._epoch_rng = _gen_state(self.generator)

    def _iter_engine(self, plan: List[Any], positions: Optional[List[int]] = None) -> Iterator[Any]:
        """The batches of ``plan`` on the engine. With ``positions`` (each
        batch's place in the epoch's whole plan; ``in_order=False``), the
        places delivered are recorded for ``state_dict()``."""
        runner = self._runner
        if not self._torch._auto_collation and not all(_is_index(b) for b in plan):
            # Each item goes to __getitem__ whole, as torch's fetcher does.
            self._work.keys = list(plan)
            batches = [[k] for k in range(len(plan))]
        else:
            self._work.keys = None
            batches = [list(map(int, b if self._torch._auto_collation else [b])) for b in plan]
        where: Dict[Any, List[int]] = {}
        if positions is not None:
            for j in range(len(batches) - 1, -1, -1):
                where.setdefault(tuple(batches[j]), []).append(j)
        runner.start(batches)
        while True:
            got = runner.next()
            if got is None:
                break
            self._yielded += 1
            if positions is not None:
                left = where.get(tuple(got[0]))
                if left:
                    self._delivered.append(positions[left.pop()])
            yield got[1]
        self._finish_epoch(runner.report())

    def _iter_inline(self, plan: List[Any]) -> Iterator[Any]:
        t0 = time.perf_counter()
        getitem = collate = stall = 0.0
        skipped: List[Dict[str, Any]] = []
        auto = self._torch._auto_collation
        n = 0
        for b in plan:
            t = time.perf_counter()
            samples = []
            kept: List[int] = []
            for i in b if auto else [b]:
                try:
                    samples.append(self.dataset[i])
                    kept.append(int(i) if _is_index(i) else i)
                except Exception as e:
                    if not self._skip:
                        raise
                    skipped.append({"index": int(i) if _is_index(i) else i, "stage": "getitem", "error": repr(e)})
            t1 = time.perf_counter()
            getitem += t1 - t
            if not samples:
                continue
            if auto and self._skip:
                batch = self._collate_skipping(samples, kept, skipped)
                if batch is None:
                    continue
            else:
                batch = self.collate_fn(samples if auto else samples[0])
            if self.pin_memory:
                batch = tud._utils.pin_memory.pin_memory(batch)
            collate += time.perf_counter() - t1
            stall += time.perf_counter() - t
            self._yielded += 1
            n += 1
            yield batch
        self._finish_epoch(
            {
                "batches": n,
                "seconds": time.perf_counter() - t0,
                "getitem_seconds": getitem,
                "collate_seconds": collate,
                "data_stall_seconds": stall,
                "skipped": skipped,
            }
        )

    def _collate_skipping(self, samples: List[Any], indices: List[int], skipped: List[Dict[str, Any]]) -> Any:
        """Collates under ``on_error="skip"``: a failing batch loses only the
        samples at fault (see ``_blame``), each recorded in ``skipped``;
        ``None`` when none is left."""
        samples, indices = list(samples), list(indices)
        while samples:
            try:
                return self.collate_fn(samples)
            except Exception as e:
                at = _blame(samples, self.collate_fn)
                drop = range(len(samples)) if at is None else [at]
                for k in drop:
                    skipped.append({"index": indices[k], "stage": "collate", "error": repr(e)})
                if at is None:
                    return None
                del samples[at], indices[at]
        return None

    def _iter_iterable(self, skip: int, restore: Optional[Dict[str, Any]] = None) -> Iterator[Any]:
        """The batches of an iterable dataset. ``restore`` (a state's
        ``iterable`` part: each worker's dataset state, which have ended,
        which worker is next) resumes datasets that keep a state from it,
        as torchdata does, instead of skipping ``skip`` batches."""
        base_seed = torch.empty((), dtype=torch.int64).random_(generator=self.generator).item()
        n = max(1, self.num_workers)
        if restore is not None:
            if len(restore.get("workers", [])) != n:
                raise ValueError(
                    f"state: taken with {len(restore.get('workers', []))} iterable workers, this loader has {n}; "
                    "a dataset's own states resume only on as many workers"
                )
            skip = 0
        if self.num_workers == 0:
            first = restore["workers"][0] if restore is not None else None
            if restore is not None and restore["done"][0]:
                src: Iterator[Any] = iter(())
            else:
                src = _iterable_batches(self, self.dataset, None, first)

            def tracked() -> Iterator[Any]:
                for batch, st in src:
                    if st is not None:
                        self._iter_state = {"workers": [st], "done": [False], "next": 0}
                    yield batch

            gen: Iterator[Any] = tracked()
        else:
            self._threads = _IterWorkers(self, base_seed, restore)
            gen = iter(self._threads)
        t0 = time.perf_counter()
        stall = 0.0
        n = 0
        try:
            while True:
                t = time.perf_counter()
                try:
                    batch = next(gen)
                except StopIteration:
                    break
                stall += time.perf_counter() - t
                n += 1
                if n <= skip:
                    continue
                self._yielded += 1
                yield batch
        finally:
            if self._threads is not None:
                self._threads.close()
                self._threads = None
        self._finish_epoch({"batches": n - skip, "seconds": time.perf_counter() - t0, "data_stall_seconds": stall,
                            "skipped": []})

    def state_dict(self) -> Dict[str, Any]:
        """Where the next batch comes from: after ``k`` batches of an epoch, a
        new loader given this state yields exactly the remaining ones; taken
        after an epoch's last batch, the next epoch. JSON-serialisable as
        long as the states of a dataset or sampler that keep one (their
        ``state_dict()``, saved with it and restored by
        ``load_state_dict``, as torchdata's ``StatefulDataLoader`` does)
        are."""
        if self._native is not None:
            return self._native.state_dict()
        if self._resume is not None:
            return dict(self._resume)
        state: Dict[str, Any] = {
            "format": "ferrofeed-dataloader-v1",
            "epoch": self._epoch,
            "batches": self._yielded,
            "rng": self._epoch_rng,
        }
        if not self.in_order and self._delivered:
            # Batches come out of order: which of the epoch's were delivered.
            state["delivered"] = sorted(self._delivered)
        if self._iterable:
            if self._iter_state is not None:
                state["iterable"] = copy.deepcopy(self._iter_state)
            return state
        if self._plan_len and self._yielded >= self._plan_len:
            state["finished"] = True
        if self._snaps:
            # The samplers' own state after the batches delivered (out of
            # order: after the first one not yet delivered).
            at = self._yielded
            if not self.in_order and self._runner is not None:
                done = set(self._delivered)
                at = next(k for k in itertools.count(self._snap_base) if k not in done)
            k = min(max(at - self._snap_base, 0), len(self._snaps) - 1)
            state["samplers"] = copy.deepcopy(self._snaps[k])
            state["samplers_at"] = self._snap_base + k
        if _stateful(self.dataset):
            if self._runner is not None and not self._warned_state:
                self._warned_state = True
                warnings.warn(
                    "the dataset's state_dict() is that of the one dataset the worker threads share, "
                    "taken now: it includes samples fetched ahead of the batches delivered (torch's "
                    "worker processes each keep a copy); with num_workers=0 it is exact",
                    stacklevel=2,
                )
            state["dataset"] = copy.deepcopy(self.dataset.state_dict())
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Makes the next iteration continue where ``state`` was taken."""
        if self._native is not None:
            self._native.load_state_dict(state)
            return
        if not isinstance(state, dict) or state.get("format") != "ferrofeed-dataloader-v1":
            raise ValueError("state: not a state_dict() of ferrofeed.torch.DataLoader")
        for k, t in (("epoch", int), ("batches", int), ("rng", str)):
            if not isinstance(state.get(k), t):
                raise ValueError(f"state: field {k!r} is missing or not a {t.__name__}")
        delivered = state.get("delivered")
        if delivered is not None and not (
            isinstance(delivered, list) and all(isinstance(k, int) and k >= 0 for k in delivered)
        ):
            raise ValueError("state: field 'delivered' is not a list of batch numbers")
        self._resume = dict(state)

    def report(self) -> Dict[str, Any]:
        """The last finished epoch: ``getitem_seconds`` (time in
        ``__getitem__``), ``collate_seconds``, ``data_stall_seconds`` (the
        consumer's wait), ``skipped`` samples, and for multi-worker map-style
        datasets the engine's per-stage table and bytes in flight."""
        if self._native is not None:
            return self._native.report() or {}
        return dict(self._report)

    def close(self) -> None:
        """Stops the running epoch and joins its threads."""
        if self._runner is not None:
            self._runner.close()
        if self._threads is not None:
            self._threads.close()
        native = self.__dict__.get("_native")
        if native is not None:
            native.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _iterable_batches(
    loader: DataLoader, dataset: Any, info: Optional[Any], restore: Optional[Dict[str, Any]] = None
) -> Iterator[Any]:
    """One worker's batches of an iterable dataset, as torch's fetcher makes
    them (the last may be short unless ``drop_last``), each with the state
    of the dataset and its iterator after it when either keeps one (else
    ``None``). ``restore`` (such a state) is loaded first, after
    ``worker_init_fn``, as torchdata's workers do."""
    if info is not None:
        _infos[threading.get_ident()] = (info, loader._token)
        if loader.worker_init_fn is not None:
            loader.worker_init_fn(info.id)
    if restore is not None and restore.get("dataset") is not None and _stateful(dataset):
        dataset.load_state_dict(restore["dataset"])
    it = iter(dataset)
    if restore is not None and restore.get("iter") is not None and _stateful(it):
        it.load_state_dict(restore["iter"])
    own_iter = it is not dataset and _stateful(it)
    keeps = _stateful(dataset) or own_iter

    def state() -> Optional[Dict[str, Any]]:
        if not keeps:
            return None
        return {
            "dataset": copy.deepcopy(dataset.state_dict()) if _stateful(dataset) else None,
            "iter": copy.deepcopy(it.state_dict()) if own_iter else None,
        }

    auto = loader._torch._auto_collation
    bs = loader.batch_size
    while True:
        if auto:
            items = list(itertools.islice(it, bs))
            if not items or (loader.drop_last and len(items) < bs):
                return
            batch = loader.collate_fn(items)
        else:
            try:
                batch = loader.collate_fn(next(it))
            except StopIteration:
                return
        if loader.pin_memory:
            batch = tud._utils.pin_memory.pin_memory(batch)
        yield batch, state()


_DONE = object()


class _IterWorkers:
    """``num_workers`` threads, each iterating its own copy of an iterable
    dataset; batches are taken from the workers in turn, as torch does.
    ``restore`` (a state's ``iterable`` part) gives each copy its saved
    state, skips the workers that had ended, and starts at the worker that
    was next."""

    def __init__(self, loader: DataLoader, base_seed: int, restore: Optional[Dict[str, Any]] = None):
        n = loader.num_workers
        depth = max(1, loader.prefetch_factor or 2)
        self._loader = loader
        self._queues: List[queue.Queue] = [queue.Queue(maxsize=depth) for _ in range(n)]
        self._stop = threading.Event()
        self._timeout = loader.timeout or None
        self._threads = []
        start = loader._iter_state
        self._states: List[Any] = list(start["workers"]) if start is not None else [None] * n
        self._done: List[bool] = [bool(d) for d in restore["done"]] if restore is not None else [False] * n
        self._next = int(restore.get("next", 0)) % n if restore is not None else 0
        for w in range(n):
            if self._done[w]:
                continue
            info = WorkerInfo(w, n, base_seed + w, copy.copy(loader.dataset))
            t = threading.Thread(target=self._work, args=(loader, info, self._queues[w], restore["workers"][w] if restore is not None else None),
                                 daemon=True, name=f"ferrofeed-worker-{w}")
            t.start()
            self._threads.append(t)

    def _put(self, q: queue.Queue, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _work(self, loader: DataLoader, info: Any, q: queue.Queue, restore: Optional[Dict[str, Any]]) -> None:
        try:
            for batch, st in _iterable_batches(loader, info.dataset, info, restore):
                if not self._put(q, (None, batch, st)):
                    return
        except BaseException as e:  # handed to the consumer with the worker named
            e.args = (f"{e.args[0] if e.args else ''} (in DataLoader worker thread {info.id})",) + tuple(e.args[1:])
            self._put(q, (e, None, None))
            return
        finally:
            _infos.pop(threading.get_ident(), None)
        self._put(q, (_DONE, None, None))

    def _note(self) -> None:
        if any(st is not None for st in self._states):
            self._loader._iter_state = {"workers": list(self._states), "done": list(self._done), "next": self._next}

    def __iter__(self) -> Iterator[Any]:
        n = len(self._queues)
        while not all(self._done):
            w = self._next
            if self._done[w]:
                self._next = (w + 1) % n
                continue
            deadline = None if self._timeout is None else time.monotonic() + self._timeout
            while True:
                try:
                    err, batch, st = self._queues[w].get(timeout=0.05)
                    break
                except queue.Empty:
                    if deadline is not None and time.monotonic() > deadline:
                        raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
            self._next = (w + 1) % n
            if err is _DONE:
                self._done[w] = True
                self._note()
                continue
            if err is not None:
                raise err
            if st is not None:
                self._states[w] = st
            self._note()
            yield batch

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
