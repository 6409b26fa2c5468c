"""``ferrofeed.Pipeline``: compose ferrofeed's engine from Python — a source,
stages in order, a collate, settings.

Native stages run as the native loaders' own typed stages; Python stages
(``.map``) run on the same worker threads, each sample handed to them as a
dict of components (numpy arrays, ints, Python objects)::

    import ferrofeed as ff

    def jitter(sample, rng):
        img = sample["image"].astype("float32")
        sample["image"] = img * rng.uniform(0.8, 1.2)
        return sample

    loader = (ff.Pipeline(ff.source.image_folder("train/"), batch_size=64, seed=0)
              .read()
              .decode_image(transform="train", size=224)
              .map(jitter)
              .build())
    for batch in loader:          # epoch 0, then 1, …
        images, labels = batch["images"], batch["labels"]

``rng`` is a ``numpy.random.Generator`` drawn from (seed, epoch, sample
index, stage name): the batches are the same for any number of workers.
"""

from __future__ import annotations

import numbers
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _ferrofeed

__all__ = ["Pipeline", "source", "Source", "default_collate"]

PathLike = Union[str, "os.PathLike[str]"]

# The audio flags that shape chunks (source.audio), features
# (.features) and augmentation (.augment).
_AUDIO_SOURCE = ("sample_rate", "chunk_seconds", "overlap_seconds", "chunk_offsets", "segment_seconds", "channels",
                 "non_finite", "interleave")
_AUDIO_FEATURES = ("n_fft", "hop", "n_mels", "feature_cache", "feature_cache_size")
_AUDIO_AUGMENT = ("time_masks", "time_mask_width", "freq_masks", "freq_mask_width", "gain_db")

# Keywords of ``Pipeline(...)`` beyond the settings every domain shares
# (``max_tokens``: length buckets of text instead of a fixed batch size).
_OWN = ("output", "pin_memory", "device", "max_tokens")


class Source:
    """Where a pipeline's samples come from, and the components each starts
    with (see ``ferrofeed.source``)."""

    def __init__(self, kind: str, what: Any, components: Tuple[str, ...], native: bool):
        self.kind = kind
        self.what = what
        self.components = components
        # Whether its components are native (typed, read by native stages)
        # or Python objects.
        self.native = native

    def __repr__(self) -> str:
        return f"ferrofeed.source.{self.kind}({self.what!r})"


def _dataset_path(source: str, path: Any) -> str:
    """``path`` as text: a local path that exists, or a URL."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{source}: path: expected a str or path, got {type(path).__name__}")
    p = os.fspath(path)
    if "://" not in p and not os.path.exists(p):
        raise FileNotFoundError(f"{source}: {p}: no such file or directory")
    return p


class _Sources:
    """``ferrofeed.source``: the sources a pipeline starts from."""

    @staticmethod
    def image_folder(path: PathLike) -> Source:
        """An ImageFolder tree (``path/<class>/<file>``): components
        ``path`` and ``label`` (the class's position in name order)."""
        p = _dataset_path("image_folder", path)
        return Source("image_folder", p, ("path", "label"), True)

    @staticmethod
    def shards(path_or_url: PathLike) -> Source:
        """WebDataset shards: a ``.tar`` file, a folder of them, or a URL
        prefix holding them; components ``bytes`` (each sample's image
        member) and ``label`` (its ``.cls``)."""
        p = _dataset_path("shards", path_or_url)
        return Source("shards", p, ("bytes", "label"), True)

    @staticmethod
    def files(paths: Sequence[PathLike], labels: Optional[Sequence[int]] = None,
              classes: Optional[Sequence[str]] = None) -> Source:
        """Files in the order given: components ``path`` and ``label``
        (``labels[i]``, else 0); ``classes`` names the labels."""
        ps = [os.fspath(p) for p in paths]
        if not ps:
            raise ValueError("files: no paths")
        if labels is None:
            ls = [0] * len(ps)
        else:
            ls = [int(x) for x in labels]
            if len(ls) != len(ps):
                raise ValueError(f"files: {len(ps)} paths but {len(ls)} labels")
        names = [str(c) for c in classes] if classes is not None else [str(c) for c in sorted(set(ls))]
        root = os.path.commonpath([os.path.abspath(p) for p in ps])
        return Source("files", (root, names, list(zip(ps, ls))), ("path", "label"), True)

    @staticmethod
    def text_lines(path: PathLike, field: Optional[str] = None) -> Source:
        """Lines of a ``.txt``/``.jsonl`` file or folder of them (or a URL
        prefix): component ``text`` (``field``: the JSON field of ``.jsonl``
        lines, default ``"text"``)."""
        p = _dataset_path("text_lines", path)
        if field is not None and not isinstance(field, str):
            raise TypeError(f"text_lines: field: expected a str, got {type(field).__name__}")
        return Source("text_lines", (p, field), ("text",), True)

    @staticmethod
    def audio(path: PathLike, **flags: Any) -> Source:
        """Audio files (wav, flac, mp3, ogg) in a folder, recursively, or a
        URL prefix, read as streamed chunks: components ``audio`` (float32
        ``[samples]``), ``chunk_start`` and ``path`` (the chunk's file). ``flags``: the chunking flags
        of ``ferrofeed audio`` (``sample_rate``, ``chunk_seconds``,
        ``overlap_seconds``, ``chunk_offsets``, ``segment_seconds``,
        ``channels``, ``non_finite``, ``interleave``)."""
        p = _dataset_path("audio", path)
        known = set(_AUDIO_SOURCE)
        for k in flags:
            if k not in known:
                raise TypeError(f"audio() got an unexpected keyword argument '{k}'")
        return Source("audio", (p, dict(flags)), ("audio", "chunk_start"), True)

    @staticmethod
    def iterable(factory: Callable[[int, int], Any], num_shards: int = 64) -> Source:
        """A stream: ``factory(shard, num_shards)`` returns an iterator over
        that shard's items (items as for ``sequence``). The shards are split
        across ranks and workers as tar shards are, each read by one worker
        per epoch; ``num_shards`` is fixed, so the batches do not depend on
        the number of workers."""
        if not callable(factory):
            raise TypeError(f"iterable: factory: expected a function, got {type(factory).__name__}")
        if not isinstance(num_shards, int) or isinstance(num_shards, bool) or not 1 <= num_shards <= 1 << 20:
            raise ValueError(f"iterable: num_shards: expected an int from 1 to 2^20, got {num_shards!r}")
        return Source("iterable", (factory, num_shards), (), False)

    @staticmethod
    def sequence(obj: Any) -> Source:
        """Any object with ``__len__`` and ``__getitem__``: sample ``i`` is
        ``obj[i]``; a returned dict's keys become components, any other
        value the component ``item``."""
        if not (hasattr(obj, "__len__") and hasattr(obj, "__getitem__")):
            raise TypeError(f"sequence: {type(obj).__name__} has no __len__ and __getitem__")
        return Source("sequence", obj, (), False)


source = _Sources()


class _Stage:
    def __init__(self, kind: str, name: str, reads: Tuple[str, ...], writes: Tuple[str, ...], **args: Any):
        self.kind = kind
        self.name = name
        self.reads = reads
        self.writes = writes
        self.args = args


def _check_name(name: Optional[str], fn: Callable[..., Any], taken: List[str]) -> str:
    if not callable(fn):
        raise TypeError(f"expected a function, got {type(fn).__name__}")
    n = name if name is not None else getattr(fn, "__name__", "map")
    if not isinstance(n, str) or not n:
        raise TypeError(f"name: expected a non-empty str, got {n!r}")
    if n == "<lambda>":
        n = "map"
    base, k = n, 2
    while n in taken:
        n = f"{base}_{k}"
        k += 1
    return n


class Pipeline:
    """A source, stages in order, a collate and settings; ``.build()`` makes
    the loader.

    Settings (keywords): ``batch_size``, ``drop_last``, ``shuffle``,
    ``seed``, ``workers`` (``"auto"`` or an int), ``on_error`` (``"fail"``,
    ``"skip"``, ``"retry:N"``), ``max_bytes_in_flight``, ``rank`` /
    ``world_size`` (default: torchrun's environment), ``output``
    (``"torch"``/``"numpy"``), and every other setting the native loaders
    share (``limit_batches``, ``report_json``, …)."""

    def __init__(self, src: Source, **settings: Any):
        if not isinstance(src, Source):
            raise TypeError(f"source: expected a ferrofeed.source.*(…), got {type(src).__name__}")
        known = set(_ferrofeed.setting_names("common")) | set(_ferrofeed.setting_names("remote")) | set(_OWN)
        for k in settings:
            if k not in known:
                raise TypeError(f"Pipeline() got an unexpected keyword argument '{k}'")
            if k == "dump":
                raise ValueError("dump: a setting of the command's run loop; a loader hands batches to you")
        self._source = src
        self._settings = dict(settings)
        self._stages: List[_Stage] = []
        self._collate: Optional[Callable[[List[Dict[str, Any]]], Dict[str, Any]]] = None
        # A transform given in full (``ferrofeed.torch``'s native=True sets
        # torchvision's own crop ranges and flip probability).
        self._transform: Optional[Tuple[Any, ...]] = None
        # False: decode without EXIF orientation (torchvision's PIL loader).
        self._exif: Optional[bool] = None

    def _add(self, stage: _Stage) -> "Pipeline":
        self._stages.append(stage)
        return self

    # Native stages.

    def read(self) -> "Pipeline":
        """``path`` → ``bytes``: reads each sample's file."""
        return self._add(_Stage("read", "read", ("path",), ("bytes",)))

    def decode_image(self, **options: Any) -> "Pipeline":
        """``bytes`` → ``image`` (uint8 ``[3, H, W]``): decodes and
        transforms; the keywords are the vision flags (``transform``,
        ``size``, ``resize``, ``max_pixels``, ``cache_bytes``, …). Python
        stages after it get ``image``, ``label`` and the sample's ``path``
        (its file) or ``key`` (its shard member)."""
        known = set(_ferrofeed.setting_names("vision"))
        for k in options:
            if k not in known:
                raise TypeError(f"decode_image() got an unexpected keyword argument '{k}'")
        return self._add(_Stage("decode_image", "decode", ("bytes",), ("image",), options=dict(options)))

    def tokenize(self, tokenizer: Optional[PathLike] = None, max_length: Optional[int] = None,
                 field: Optional[str] = None) -> "Pipeline":
        """``text`` → ``input_ids``: a HuggingFace ``tokenizer.json``
        (default: the embedded BERT WordPiece), truncated to
        ``max_length`` tokens; ``field``: the JSON field of ``.jsonl``
        lines. The keywords are the text flags of the same names."""
        options: Dict[str, Any] = {}
        if tokenizer is not None:
            options["tokenizer"] = os.fspath(tokenizer)
        if max_length is not None:
            options["max_length"] = max_length
        if field is not None:
            options["field"] = field
        return self._add(_Stage("tokenize", "tokenize", ("text",), ("input_ids",), options=options))

    def features(self, kind: str = "logmel", **flags: Any) -> "Pipeline":
        """``audio`` → ``features`` (float32 ``[bins, frames]``): ``kind``
        ``"logmel"``, ``"mel"``, ``"spectrogram"`` or ``"waveform"``;
        ``flags``: ``n_fft``, ``hop``, ``n_mels``, ``feature_cache``,
        ``feature_cache_size``."""
        for k in flags:
            if k not in _AUDIO_FEATURES:
                raise TypeError(f"features() got an unexpected keyword argument '{k}'")
        if not isinstance(kind, str):
            raise TypeError(f"features: kind: expected a str, got {type(kind).__name__}")
        return self._add(_Stage("features", "features", ("audio",), ("features",),
                                options={"features": kind, **flags}))

    def augment(self, **flags: Any) -> "Pipeline":
        """SpecAugment masks and a random gain on ``features``, seeded per
        sample and epoch: ``time_masks``, ``time_mask_width``,
        ``freq_masks``, ``freq_mask_width``, ``gain_db``."""
        for k in flags:
            if k not in _AUDIO_AUGMENT:
                raise TypeError(f"augment() got an unexpected keyword argument '{k}'")
        return self._add(_Stage("augment", "augment", ("features",), ("features",), options=dict(flags)))

    def normalize(self, mean: Sequence[float], std: Sequence[float]) -> "Pipeline":
        """``image`` → float32 ``[3, H, W]``: ``(x / 255 - mean) / std`` per
        channel."""
        m, s = _three("mean", mean), _three("std", std)
        if any(v <= 0 for v in s):
            raise ValueError(f"std: every value must be positive, got {list(s)}")
        return self._add(_Stage("normalize", "normalize", ("image",), ("image",), mean=m, std=s))

    # Python stages.

    def map(self, fn: Callable[[Dict[str, Any], np.random.Generator], Dict[str, Any]], *,
            name: Optional[str] = None) -> "Pipeline":
        """A Python stage: ``fn(sample, rng) -> dict`` on the worker threads;
        the dict it returns is the sample from then on."""
        n = _check_name(name, fn, [s.name for s in self._stages])
        return self._add(_Stage("map", n, (), (), fn=fn))

    def map_batches(self, fn: Callable[[Dict[str, Any], np.random.Generator], Dict[str, Any]], *,
                    name: Optional[str] = None) -> "Pipeline":
        """A Python stage over each collated batch: ``fn(batch, rng) ->
        dict``, ``rng`` drawn from (seed, epoch, batch number, stage)."""
        n = _check_name(name, fn, [s.name for s in self._stages])
        return self._add(_Stage("map_batches", n, (), (), fn=fn))

    def collate(self, fn: Callable[[List[Dict[str, Any]]], Dict[str, Any]]) -> "Pipeline":
        """``fn(samples) -> dict`` instead of the default collate."""
        if not callable(fn):
            raise TypeError(f"collate: expected a function, got {type(fn).__name__}")
        self._collate = fn
        return self

    def _check_flow(self) -> None:
        """Every native stage reads components that the source or an earlier
        native stage wrote; Python stages come after the native ones, and
        ``.map`` stages before ``.map_batches``."""
        have = set(self._source.components) if self._source.native else set()
        first_python: Optional[_Stage] = None
        first_batch: Optional[_Stage] = None
        for st in self._stages:
            if st.kind == "map_batches":
                first_batch = first_batch or st
                first_python = first_python or st
                continue
            if st.kind == "map":
                if first_batch is not None:
                    raise ValueError(
                        f"stage {st.name!r}: a per-sample stage after map_batches {first_batch.name!r}; "
                        "put the .map stages first"
                    )
                if first_python is None and self._source.kind == "text_lines" and "input_ids" not in have:
                    raise ValueError(
                        f"stage {st.name!r}: the Python stages of a text_lines pipeline take tokenized "
                        "samples (component input_ids): add .tokenize() before it"
                    )
                if first_python is None and self._source.native and self._source.kind not in ("text_lines", "audio") \
                        and "image" not in have:
                    raise ValueError(
                        f"stage {st.name!r}: the Python stages of an image_folder pipeline take decoded "
                        "samples (components image and label): add .read().decode_image() before it"
                    )
                first_python = first_python or st
                continue
            if first_python is not None:
                raise ValueError(
                    f"stage {st.name!r} reads component {st.reads[0]!r} as a native value, but after the "
                    f"Python stage {first_python.name!r} components are Python objects: put "
                    f".{st.kind}() before it"
                )
            for c in st.reads:
                if c not in have:
                    raise ValueError(
                        f"stage {st.name!r} reads component {c!r}, which neither source."
                        f"{self._source.kind}() nor an earlier native stage writes"
                        + ("" if self._source.native else " (its samples are Python objects)")
                    )
            have.difference_update(st.reads)
            have.update(st.writes)
        kinds = [s.kind for s in self._stages if s.kind not in ("map", "map_batches")]
        if self._source.kind == "audio":
            if kinds not in ([], ["features"], ["features", "augment"]):
                raise ValueError(
                    "an audio pipeline's native stages are .features(), then optionally .augment(); "
                    f"got {'.'.join(k + '()' for k in kinds)}"
                )
        elif self._source.kind == "text_lines":
            if kinds != ["tokenize"]:
                raise ValueError(
                    f"a text_lines pipeline's native stage is .tokenize(); got {'.'.join(k + '()' for k in kinds) or 'none'}"
                )
        elif self._source.kind == "shards":
            if kinds not in (["decode_image"], ["decode_image", "normalize"]):
                raise ValueError(
                    "a shards pipeline's native stages are .decode_image(), then optionally .normalize(); "
                    f"got {'.'.join(k + '()' for k in kinds) or 'none'}"
                )
        elif self._source.native and kinds not in (["read", "decode_image"], ["read", "decode_image", "normalize"]):
            raise ValueError(
                f"a {self._source.kind} pipeline's native stages are .read().decode_image(), then optionally "
                f".normalize(); got {'.'.join(k + '()' for k in kinds) or 'none'}"
            )

    def build(self) -> "Any":
        """Checks the flow and makes the loader (as ``ferrofeed.vision``
        returns): iteration runs the next epoch, ``epoch(e)``, ``len()``,
        ``state_dict()``/``load_state_dict()``, ``report()`` (Python stages
        by name, with the time each held the GIL) and ``report_html()``."""
        from . import Loader

        self._check_flow()
        maps = [(s.name, s.args["fn"]) for s in self._stages if s.kind == "map"]
        batch_maps = [(s.name, s.args["fn"]) for s in self._stages if s.kind == "map_batches"]
        stage_options: Dict[str, Any] = {}
        for s in self._stages:
            if s.kind in ("decode_image", "tokenize", "features", "augment"):
                stage_options.update(s.args["options"])
        what = self._source.what
        if self._source.kind == "audio":
            what, flags = what
            stage_options.update(flags)
            if not any(s.kind == "features" for s in self._stages):
                # Chunks as they are: the waveform, handed on as `audio`.
                stage_options["features"] = "waveform"
                if maps or batch_maps or self._collate is not None:
                    maps.insert(0, ("to_audio", _as_audio))
        if self._source.kind == "text_lines":
            what, field = what
            if field is not None:
                stage_options.setdefault("field", field)
        norm = next(((s.args["mean"], s.args["std"]) for s in self._stages if s.kind == "normalize"), None)
        python = bool(maps or batch_maps or self._collate is not None or not self._source.native)
        collate = (self._collate or default_collate) if python else None
        spec = {
            "source": (self._source.kind, what),
            "settings": dict(self._settings),
            "stage_options": stage_options,
            "normalize": norm,
            "maps": maps,
            "batch_maps": batch_maps,
            "collate": collate,
            "transform": self._transform,
            "exif": self._exif,
        }
        return Loader._wrap(_ferrofeed.Loader.from_pipeline(spec))

    def __repr__(self) -> str:
        parts = [repr(self._source)] + [f".{s.kind}({s.name!r})" if s.kind.startswith("map") else f".{s.kind}()"
                                        for s in self._stages]
        return "ferrofeed.Pipeline(" + "".join(parts) + ")"


def _three(what: str, v: Sequence[float]) -> Tuple[float, float, float]:
    try:
        t = tuple(float(x) for x in v)
    except TypeError:
        raise TypeError(f"{what}: expected three numbers, got {type(v).__name__}") from None
    if len(t) != 3:
        raise ValueError(f"{what}: expected three numbers (one per channel), got {len(t)}")
    return t  # type: ignore[return-value]


def _as_audio(sample: Dict[str, Any], rng: Any) -> Dict[str, Any]:
    """A waveform chunk's features as the component ``audio`` (``[samples]``,
    or ``[channels, samples]`` when channels are kept)."""
    f = sample.pop("features")
    sample["audio"] = f[0] if f.ndim == 2 and f.shape[0] == 1 else f.reshape(f.shape[0], -1)
    return sample


# Batch column names of components that differ (as the native loaders').
_COLUMN = {"image": "images", "label": "labels"}


def _fail(message: str, at: Optional[int]) -> Exception:
    e = ValueError(message)
    if at is not None:
        e.__ferrofeed_sample__ = at  # type: ignore[attr-defined]
    return e


def default_collate(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Arrays of equal shape and dtype are stacked; Python ints and floats
    become int64 / float64 vectors; ``input_ids`` (lists or arrays of ints)
    are padded with 0 and get an ``attention_mask``; anything else becomes
    a list. ``image`` and ``label`` become ``images`` and ``labels``. A
    sample that lacks a component the first has, or whose array has another
    shape, fails the batch naming it and the component."""
    if not samples:
        raise ValueError("collate: no samples")
    names = list(samples[0].keys())
    for i, s in enumerate(samples):
        if not isinstance(s, dict):
            raise _fail(f"collate: sample {i} is a {type(s).__name__}, not a dict", i)
        if set(s.keys()) != set(names):
            missing = sorted(set(names) - set(s.keys())) or sorted(set(s.keys()) - set(names))
            raise _fail(f"collate: sample {i} differs from the first in component {missing[0]!r}", i)
    out: Dict[str, Any] = {}
    for name in names:
        col = [s[name] for s in samples]
        out[_COLUMN.get(name, name)] = _column(name, col)
        if name == "input_ids":
            lengths = [len(x) for x in col]
            mask = np.zeros((len(col), max(lengths)), dtype=np.int64)
            for r, n in enumerate(lengths):
                mask[r, :n] = 1
            out["attention_mask"] = mask
    return out


def _column(name: str, col: List[Any]) -> Any:
    first = col[0]
    if name == "input_ids":
        rows = [np.asarray(x, dtype=np.int64).reshape(-1) for x in col]
        width = max(len(r) for r in rows)
        out = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            out[i, : len(r)] = r
        return out
    if isinstance(first, np.ndarray) or hasattr(first, "__array_interface__") or hasattr(first, "__array__"):
        arrays = [np.asarray(x) for x in col]
        # The odd one out: the first whose shape or dtype differs from most.
        sigs = [(a.shape, a.dtype.str) for a in arrays]
        common = max(set(sigs), key=sigs.count)
        for i, sig in enumerate(sigs):
            if sig != common:
                raise _fail(
                    f"collate: component {name!r} of sample {i} is {sig[1]} {list(sig[0])}, "
                    f"the batch's others {common[1]} {list(common[0])}",
                    i,
                )
        return np.stack(arrays)
    if isinstance(first, bool) or isinstance(first, np.bool_):
        return np.asarray(col, dtype=np.bool_) if all(isinstance(x, (bool, np.bool_)) for x in col) else list(col)
    if isinstance(first, numbers.Integral) and all(isinstance(x, numbers.Integral) for x in col):
        return np.asarray(col, dtype=np.int64)
    if isinstance(first, numbers.Real) and all(isinstance(x, numbers.Real) for x in col):
        return np.asarray(col, dtype=np.float64)
    return list(col)
