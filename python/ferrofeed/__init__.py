"""ferrofeed: typed, threaded input pipelines that keep accelerators fed.

The native loaders run ferrofeed's built-in domain pipelines (vision, text,
audio) on Rust threads and hand each batch to Python as a dict of torch
tensors (or numpy arrays) that share ferrofeed's buffers::

    import ferrofeed
    loader = ferrofeed.vision(batch_size=64, transform="train", seed=0)
    for epoch in range(3):
        for batch in loader:                     # epoch 0, then 1, then 2
            images, labels = batch["images"], batch["labels"]

Options are the flags of the matching ``ferrofeed`` subcommand as keywords
(``-`` becomes ``_``), read and checked by the same code as the command.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Iterator, Optional, Union

from . import _ferrofeed
from ._ferrofeed import Array

__version__: str = _ferrofeed.__version__

__all__ = [
    "Loader",
    "SampleError",
    "Array",
    "Pipeline",
    "source",
    "vision",
    "text",
    "audio",
    "options",
    "__version__",
]

PathLike = Union[str, "os.PathLike[str]"]


class SampleError(RuntimeError):
    """A sample failed under ``on_error="fail"``.

    Attributes:
        index: the sample's dataset index (``None`` when the failure is not
            one sample's, such as a shard that cannot be opened).
        path: the file (or ``shard.tar#key``) it came from, when known.
        stage: the stage that failed (``read``, ``decode``, ``collate``, …).
    """

    def __init__(self, message: str, index: Optional[int], path: Optional[str], stage: str):
        super().__init__(message)
        self.index = index
        self.path = path
        self.stage = stage

    def __reduce__(self) -> Any:
        # Keeps index, path and stage when pickled (Ray and multiprocessing
        # carry errors between processes that way).
        return (type(self), (str(self), self.index, self.path, self.stage))


class Loader:
    """A ferrofeed pipeline for one domain, iterated an epoch at a time.

    ``for batch in loader`` runs the next epoch (the first loop epoch 0, the
    next epoch 1, …); ``loader.epoch(e)`` runs epoch ``e``. Breaking out of
    a loop and looping again starts the next epoch cleanly. A batch is a
    ``dict`` of tensors named as the command's ``--dump`` files, plus
    ``indices`` (int64 dataset indices).

    Each ``iter()`` (or ``epoch()``) starts an epoch and ends the one before:
    an iterator taken earlier then raises ``RuntimeError`` instead of
    reading the newer epoch's batches, and a loader is iterated by one
    thread at a time (another thread's ``next()`` meanwhile raises
    ``RuntimeError``).
    """

    def __init__(self, domain: str, path: Optional[PathLike] = None, **options: Any):
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected a str or path, got {type(path).__name__}")
        self._inner = _ferrofeed.Loader(domain, None if path is None else os.fspath(path), options)
        # The iterator whose epoch runs now, and the lock `next()` holds.
        self._generation = 0
        self._busy = threading.Lock()

    @classmethod
    def _wrap(cls, inner: Any) -> "Loader":
        """A loader over a native loader already made (``Pipeline.build()``)."""
        self = cls.__new__(cls)
        self._inner = inner
        self._generation = 0
        self._busy = threading.Lock()
        return self

    @property
    def domain(self) -> str:
        """``"vision"``, ``"text"`` or ``"audio"``."""
        return self._inner.domain

    def __len__(self) -> int:
        """Batches per epoch on this rank. Audio loaders know it from WAV
        headers; with files of other formats, whose chunk count is known only
        once decoded, they raise ``TypeError`` as ``len()`` of an iterable
        without a length does."""
        return len(self._inner)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        """Runs the next epoch."""
        with self._exclusive():
            self._generation += 1
            return _Epoch(self, iter(self._inner), self._generation)

    def epoch(self, e: int) -> Iterator[Dict[str, Any]]:
        """Runs epoch ``e``; the next plain iteration runs ``e + 1``."""
        if not isinstance(e, int) or isinstance(e, bool) or e < 0:
            raise ValueError(f"e: expected a whole number ≥ 0, got {e!r}")
        with self._exclusive():
            self._generation += 1
            return _Epoch(self, self._inner.epoch(e), self._generation)

    def _exclusive(self) -> "_Held":
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(
                "this loader is being iterated by another thread: a loader is iterated by one thread "
                "at a time (make one loader per thread, with rank/world_size to split the data)"
            )
        return _Held(self._busy)

    def state_dict(self) -> Dict[str, Any]:
        """The position after the last batch handed out (JSON-serialisable).

        A new loader with the same options given it by
        :meth:`load_state_dict` continues exactly there.
        """
        return self._inner.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Makes the next iteration continue where ``state`` was taken."""
        if not isinstance(state, dict):
            raise TypeError(f"state: expected a dict from state_dict(), got {type(state).__name__}")
        self._inner.load_state_dict(state)

    def report(self) -> Optional[Dict[str, Any]]:
        """The last finished epoch's report (the command's ``--report-json``
        fields: ``samples``, ``skipped``, ``stages``, ``bottleneck``,
        ``data_stall_seconds``, …), or ``None`` before an epoch finished."""
        return self._inner.report()

    def report_html(self, path: PathLike) -> None:
        """Writes the last finished epoch's report as one self-contained HTML
        page (headline, per-stage table, plots over time, skipped samples,
        resources; for vision a strip of samples)."""
        self._inner.report_html(os.fspath(path))

    def close(self) -> None:
        """Stops the running epoch and joins its threads (also done when the
        loader is deleted)."""
        self._inner.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ferrofeed.Loader({self.domain!r}, next_epoch={self._inner.next_epoch})"


class _Held:
    """Releases a lock taken without blocking when its ``with`` ends."""

    __slots__ = ("_lock",)

    def __init__(self, lock: Any):
        self._lock = lock

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


class _Epoch:
    """One epoch's batches; records the wait for each in torch's profiler
    (as ``ferrofeed: wait for batch``) when torch is imported."""

    __slots__ = ("_loader", "_it", "_generation")

    def __init__(self, loader: Loader, it: Any, generation: int):
        self._loader = loader
        self._it = it
        self._generation = generation

    def __iter__(self) -> "_Epoch":
        return self

    def __next__(self) -> Dict[str, Any]:
        loader = self._loader
        with loader._exclusive():
            if self._generation != loader._generation:
                raise RuntimeError(
                    "this iterator's epoch was ended by a later iter() or epoch() of the same loader: "
                    "each iter() runs the next epoch, so iterate the newest one"
                )
            torch = _torch()
            if torch is None or not torch.autograd.profiler._is_profiler_enabled:
                return next(self._it)
            with torch.profiler.record_function("ferrofeed: wait for batch"):
                return next(self._it)


from .pipeline import Pipeline, source  # noqa: E402


def _torch() -> Any:
    import sys

    return sys.modules.get("torch")


def vision(path: Optional[PathLike] = None, **options: Any) -> Loader:
    """The vision pipeline: an ImageFolder tree or WebDataset shards, a local
    path or a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, read
    through the local cache: ``remote_cache``, ``remote_cache_size``,
    ``prefetch``, ``download_workers``); ``None``: the embedded default
    dataset. Options: the flags of ``ferrofeed
    vision`` (``batch_size``, ``transform``, ``size``, ``resize``, ``seed``,
    ``shuffle``, ``workers``, ``max_bytes_in_flight``, ``on_error``, ``rank``,
    ``world_size``, ``drop_last``, ``cache_bytes``, ``image_cache`` and
    ``image_cache_size`` (decoded images on disk), ``stream_shards`` and
    ``shuffle_buffer`` (WebDataset shards read shard by shard, remote ones
    downloaded in the epoch's order), …; ``epochs`` is the
    number of epochs planned: with 1 the scan index, which pays from the
    second epoch, is off) plus ``output``
    (``"torch"``/``"numpy"``), ``pin_memory`` (``"auto"``/True/False) and
    ``device`` (``None``/``"cuda"``/``"cuda:N"``)."""
    return Loader("vision", path, **options)


def text(path: Optional[PathLike] = None, **options: Any) -> Loader:
    """The text pipeline: a ``.txt``/``.jsonl`` file or folder, or a URL
    prefix holding such objects (``None``: the embedded corpus). Options: the flags of ``ferrofeed text``
    (``batch_size``, ``max_tokens``, ``max_length``, ``tokenizer``, ``pack``,
    ``field``, …) plus ``output`` and ``device``."""
    return Loader("text", path, **options)


def audio(path: Optional[PathLike] = None, **options: Any) -> Loader:
    """The audio pipeline: a folder of audio files, or a URL prefix holding
    them (``None``: the embedded dataset). Options: the flags of ``ferrofeed audio`` (``batch_size``,
    ``sample_rate``, ``chunk_seconds``, ``overlap_seconds``, ``features``,
    ``n_fft``, ``hop``, ``n_mels``, ``feature_cache``, ``chunk_offsets``,
    ``segment_seconds`` (long files read as segments by several workers), …)
    plus ``output`` and ``device``."""
    return Loader("audio", path, **options)


def options(domain: str) -> Dict[str, bool]:
    """Every option ``domain``'s loader takes, mapped to whether it takes a
    value (``False``: a switch such as ``autotune``)."""
    own = {"output": True, "pin_memory": True, "device": True}
    return {**dict(_ferrofeed.flags(domain)), **own}
