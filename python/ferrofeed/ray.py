"""ferrofeed pipelines as Ray Data datasets.

When preprocessing outgrows one machine, Ray Data schedules it: each read
task runs a native ferrofeed pipeline over a disjoint share of the files or
shards (ferrofeed's own sharding, one rank per task, nothing repeated) and
emits its batches as blocks — numpy columns named as in a batch, with
``indices``, images and features as Ray tensor columns::

    import ray, ferrofeed.ray
    ds = ferrofeed.ray.read("vision", "s3://bucket/train/", epoch=0,
                            batch_size=64, transform="train", seed=0)
    for batch in ds.iter_torch_batches(batch_size=64):
        ...
    print(ferrofeed.ray.report(ds)["skipped"])   # every task's skipped samples

One pass over ``ds`` yields every sample of that epoch exactly once,
whatever the number of read tasks; the same seed and epoch give the same
rows; ``read(..., epoch=e + 1)`` draws a new order. Remote URLs pass through
unchanged, so each node downloads its own share into its own cache.

A Ray worker process keeps the pipelines of its last two read tasks, so
the next epoch's task for the same rank in that process starts warm (its
threads and pools kept).

Text rows keep their batch's padded length, so rows from different batches
differ in length: give ``iter_torch_batches`` ``collate_fn=ferrofeed.ray.collate``,
which pads each column to the longest row of the Ray batch.
"""

from __future__ import annotations

import json
import os
import time
import weakref
from collections import OrderedDict
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import Loader, _ferrofeed

__all__ = ["read", "FerrofeedDatasource", "report", "collate", "Collate"]

# Options a read task sets itself.
_SET_PER_TASK = ("rank", "world_size", "pad_shards")
# Options about handing batches to a device: a Ray consumer does that.
_NOT_FOR_RAY = ("output", "pin_memory", "device")

# A Ray worker process keeps the pipelines of the last read tasks it ran,
# keyed by domain, path and options (rank and world size included): the next
# epoch's task for the same rank in the same process reuses their threads,
# pools (and a scan index, when asked for) instead of starting cold.
_WARM: "OrderedDict[str, Loader]" = OrderedDict()
_WARM_MAX = 2


def _take_loader(domain: str, path: Optional[str], options: Dict[str, Any]) -> Tuple[str, Loader, bool]:
    key = json.dumps([domain, path, options], sort_keys=True, default=str)
    loader = _WARM.pop(key, None)
    if loader is not None:
        return key, loader, True
    return key, Loader(domain, path, output="numpy", **options), False


def _keep_loader(key: str, loader: Loader) -> None:
    _WARM[key] = loader
    while len(_WARM) > _WARM_MAX:
        _, old = _WARM.popitem(last=False)
        old.close()


_reports: "weakref.WeakKeyDictionary[Any, FerrofeedDatasource]" = weakref.WeakKeyDictionary()


try:
    import ray
    import ray.data
    from ray.data.block import BlockAccessor, BlockMetadata
    from ray.data.collate_fn import NumpyBatchCollateFn
    from ray.data.datasource import Datasource, ReadTask
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("ferrofeed.ray needs Ray Data: pip install 'ray[data]'") from e


def _is_url(path: Optional[str]) -> bool:
    return path is not None and "://" in path


class _Collector:
    """Each read task's figures, kept by task number (a re-executed task
    replaces its own entry, so figures never count a task twice)."""

    def __init__(self) -> None:
        self._tasks: Dict[int, Dict[str, Any]] = {}

    def put(self, task: int, figures: Dict[str, Any]) -> None:
        self._tasks[task] = figures

    def get(self) -> List[Dict[str, Any]]:
        return [self._tasks[t] for t in sorted(self._tasks)]


class FerrofeedDatasource(Datasource):
    """A ``ray.data.Datasource`` whose read tasks run ferrofeed pipelines.

    Built by :func:`read`; usable directly with ``ray.data.read_datasource``.
    ``tasks`` caps the number of read tasks (default: the cluster's CPUs
    divided by ``num_cpus``); each task runs its pipeline with ``num_cpus``
    worker threads unless ``workers`` is given.
    """

    def __init__(
        self,
        domain: str,
        path: Optional[str] = None,
        epoch: int = 0,
        *,
        tasks: Optional[int] = None,
        num_cpus: float = 1,
        **options: Any,
    ):
        super().__init__()
        if domain not in ("vision", "text", "audio"):
            raise ValueError(f"domain: {domain!r} is not one of vision, text, audio")
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected a str or path, got {type(path).__name__}")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch: expected a whole number ≥ 0, got {epoch!r}")
        if tasks is not None and (not isinstance(tasks, int) or isinstance(tasks, bool) or tasks < 1):
            raise ValueError(f"tasks: expected a whole number ≥ 1, got {tasks!r}")
        if not isinstance(num_cpus, (int, float)) or isinstance(num_cpus, bool) or num_cpus <= 0:
            raise ValueError(f"num_cpus: expected a number > 0, got {num_cpus!r}")
        for k in _SET_PER_TASK:
            if k in options:
                raise ValueError(
                    f"{k}: set by ferrofeed.ray (each read task is one rank of the read); "
                    "use tasks= for the number of read tasks"
                )
        for k in _NOT_FOR_RAY:
            if k in options:
                raise ValueError(f"{k}: rows go to Ray as numpy columns; move them to a device in the consumer")
        known = dict(_ferrofeed.flags(domain))
        for k in options:
            if k not in known:
                raise TypeError(f"{domain}() got an unexpected keyword argument '{k}'")
        self.domain = domain
        self.path = None if path is None else os.fspath(path)
        self.epoch = epoch
        self.tasks = tasks
        self.num_cpus = num_cpus
        self.options = dict(options)
        self.options.setdefault("drop_last", False)
        self.options.setdefault("quiet", True)
        if not _is_url(self.path):
            # Values are checked (and a missing path found) here, on the
            # driver, rather than in the first read task.
            Loader(domain, self.path, output="numpy", **self._task_options(0, 1)).close()
        self._collector: Any = None

    # Ray's Datasource interface.

    def get_name(self) -> str:
        return f"ferrofeed.{self.domain}"

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return None

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: Optional[int] = None,
        data_context: Any = None,
    ) -> List[Any]:
        n = self._task_count(parallelism)
        collector = self._collector_handle()
        return [
            ReadTask(
                _TaskFn(self, i, n, collector),
                BlockMetadata(
                    num_rows=None,
                    size_bytes=None,
                    input_files=None if self.path is None else (self.path,),
                    exec_stats=None,
                ),
                per_task_row_limit=per_task_row_limit,
            )
            for i in range(n)
        ]

    # Ours.

    def report(self) -> Dict[str, Any]:
        """The figures of the read tasks that have finished: ``tasks`` (each
        with ``task``, ``rank``, ``world_size``, ``node_id``, ``pid``,
        ``started`` (Unix time), ``seconds``, ``warm`` (the task reused the
        pipeline its process ran for the same rank in an earlier epoch),
        ``samples``, ``batches``, ``skipped``, and ``remote`` when the path is
        a URL: the pipeline's download figures), and over all of them
        ``samples``, ``skipped`` (every skipped sample with ``index``,
        ``path``, ``stage``, ``error``), ``skipped_count`` and, for a URL,
        ``remote`` with the tasks' ``bytes_downloaded``, ``bytes_from_cache``,
        ``requests`` and ``retries`` summed."""
        tasks = [] if self._collector is None else ray.get(self._collector.get.remote())
        skipped = [s for t in tasks for s in t["skipped"]]
        out: Dict[str, Any] = {
            "domain": self.domain,
            "epoch": self.epoch,
            "tasks": tasks,
            "samples": sum(t["samples"] for t in tasks),
            "skipped": skipped,
            "skipped_count": len(skipped),
        }
        remote = [t["remote"] for t in tasks if "remote" in t]
        if remote:
            keys = ("bytes_downloaded", "bytes_from_cache", "requests", "retries")
            out["remote"] = {k: sum(int(r.get(k, 0)) for r in remote) for k in keys}
        return out

    def _task_count(self, parallelism: Optional[int]) -> int:
        if self.tasks is not None:
            return self.tasks
        cpus = int(ray.cluster_resources().get("CPU", 1) // self.num_cpus) or 1
        if parallelism is None or parallelism < 1:
            return cpus
        return max(1, min(int(parallelism), cpus))

    def _task_options(self, rank: int, world: int) -> Dict[str, Any]:
        o = dict(self.options)
        o.setdefault("workers", max(1, int(self.num_cpus)))
        if self.domain == "vision":
            # Filling the scan index costs the first epoch ~25% and, measured
            # under Ray (bench/ray.py), later epochs gain nothing from it.
            o.setdefault("scan_index", 0)
        o.update(rank=rank, world_size=world, pad_shards=False)
        return o

    def _collector_handle(self) -> Any:
        if self._collector is None:
            self._collector = ray.remote(num_cpus=0)(_Collector).remote()
        return self._collector


class _TaskFn:
    """One read task: rank ``task`` of ``tasks``, run where Ray puts it."""

    def __init__(self, source: FerrofeedDatasource, task: int, tasks: int, collector: Any):
        self.domain = source.domain
        self.path = source.path
        self.epoch = source.epoch
        self.options = source._task_options(task, tasks)
        self.task = task
        self.tasks = tasks
        self.collector = collector

    def __call__(self) -> Iterator[Any]:
        started = time.time()
        key, loader, warm = _take_loader(self.domain, self.path, self.options)
        samples = batches = 0
        try:
            for batch in loader.epoch(self.epoch):
                cols = {k: np.asarray(v) for k, v in batch.items()}
                samples += len(cols["indices"])
                batches += 1
                yield BlockAccessor.batch_to_block(cols)
            rep = loader.report() or {}
        except BaseException:
            # A failed or abandoned epoch: its pipeline is not reused.
            loader.close()
            raise
        _keep_loader(key, loader)
        figures = {
            "task": self.task,
            "rank": self.task,
            "world_size": self.tasks,
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "started": started,
            "seconds": time.time() - started,
            "warm": warm,
            "samples": samples,
            "batches": batches,
            "skipped": list(rep.get("skipped", [])),
        }
        if rep.get("remote"):
            figures["remote"] = dict(rep["remote"])
        ray.get(self.collector.put.remote(self.task, figures))


def read(
    domain: str,
    path: Optional[str] = None,
    epoch: int = 0,
    *,
    tasks: Optional[int] = None,
    num_cpus: float = 1,
    ray_args: Optional[Dict[str, Any]] = None,
    **options: Any,
) -> Any:
    """Epoch ``epoch`` of ferrofeed's ``domain`` pipeline over ``path`` as a
    ``ray.data.Dataset``.

    Args:
        domain: ``"vision"``, ``"text"`` or ``"audio"``.
        path: what the native loader takes: a folder, file, shards or a URL
            (``None``: the embedded default dataset).
        epoch: which epoch's order and augmentations to draw.
        tasks: how many read tasks (ranks) to split the epoch into (default:
            the cluster's CPUs divided by ``num_cpus``).
        num_cpus: CPUs each read task asks Ray for; its pipeline runs that
            many worker threads unless ``workers`` is given.
        ray_args: more keywords for ``ray.data.read_datasource`` (e.g.
            ``{"memory": 2**30}`` or ``{"concurrency": 4}``). Read tasks are
            spread over the nodes (Ray Data's default); a local path must be
            visible at the same place on every node (a shared file system),
            a URL is read by each node from the store.
        **options: the native loader's options (``batch_size``, ``seed``,
            ``transform``, ``on_error``, …), except ``rank``/``world_size``
            (each task is a rank) and ``output``/``pin_memory``/``device``.

    Each row is one sample: the batch's columns (``images``, ``labels``,
    ``input_ids``, ``features``, …) plus ``indices``. After the dataset has
    been consumed, :func:`report` gives each task's figures and skipped
    samples. A failing sample under ``on_error="fail"`` raises an error that
    is a :class:`ferrofeed.SampleError` with its ``index``, ``path`` and
    ``stage``.
    """
    source = FerrofeedDatasource(domain, path, epoch, tasks=tasks, num_cpus=num_cpus, **options)
    args = dict(ray_args or {})
    # One block stream per read task, as the pipeline emits it (a batch per
    # block): left to itself, Ray would split each task's output into many
    # small blocks to reach its default block count, and pay for each.
    args.setdefault("override_num_blocks", source._task_count(None))
    ds = ray.data.read_datasource(source, num_cpus=num_cpus, **args)
    _reports[ds] = source
    return ds


def report(ds: Any) -> Dict[str, Any]:
    """The read figures of a dataset made by :func:`read` (or of a
    :class:`FerrofeedDatasource`): per task and in total, with every skipped
    sample. Figures are those of the tasks that have run so far."""
    if isinstance(ds, FerrofeedDatasource):
        return ds.report()
    source = _reports.get(ds)
    if source is None:
        raise ValueError("ds: not a dataset made by ferrofeed.ray.read (a transformed dataset has no ferrofeed figures; keep the one read returned)")
    return source.report()


class Collate(NumpyBatchCollateFn):
    """``iter_torch_batches(collate_fn=ferrofeed.ray.collate)`` for rows of
    different lengths (text): each column becomes one torch tensor, rows
    zero-padded at the end to the longest in the batch."""

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, Any]:
        import torch

        out: Dict[str, Any] = {}
        for k, v in batch.items():
            if v.dtype == object:
                rows = [np.asarray(r) for r in v]
                width = max((r.shape[0] for r in rows), default=0)
                shape = (len(rows), width) + (rows[0].shape[1:] if rows else ())
                dense = np.zeros(shape, dtype=rows[0].dtype if rows else np.int64)
                for i, r in enumerate(rows):
                    dense[i, : r.shape[0]] = r
                v = dense
            elif not v.flags.writeable or not v.flags.c_contiguous:
                v = np.array(v)
            out[k] = torch.from_numpy(v)
        return out


collate = Collate()
