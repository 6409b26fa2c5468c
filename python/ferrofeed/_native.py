"""``ferrofeed.torch.DataLoader(..., native=True)``: a torchvision
``ImageFolder``/``DatasetFolder`` with the default loader and a ``Compose``
(v1 or v2) of the common transforms, run as a native ferrofeed pipeline
over the same files, labels and transform parameters.

Translated: ``Resize`` + ``CenterCrop`` (eval), ``RandomResizedCrop`` [+
``RandomHorizontalFlip``] (train), then ``ToTensor``, ``PILToTensor`` or
``ToImage`` [+ ``ToDtype``], then ``Normalize``. Batches are ``[images,
labels]`` with the dtype, layout and value range torchvision's would have.
Anything else raises ``ValueError`` naming it::

    from torchvision import datasets, transforms as T
    ds = datasets.ImageFolder("train/", T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                                  T.ToTensor(), T.Normalize(mean, std)]))
    loader = ferrofeed.torch.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2, native=True)
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .pipeline import Pipeline, source


def _names(t: Any) -> str:
    return type(t).__name__


def _bilinear(t: Any) -> None:
    mode = getattr(t, "interpolation", "bilinear")
    # v1 and v2 keep an InterpolationMode (value "bilinear"); old code an int.
    if getattr(mode, "value", mode) not in ("bilinear", 2):
        raise ValueError(f"native=True: {_names(t)}(interpolation={mode}): only bilinear translates")
    if getattr(t, "antialias", True) is False:
        raise ValueError(f"native=True: {_names(t)}(antialias=False): only antialiased resizing translates")


def _side(t: Any, what: str, size: Any) -> int:
    """A square size (an int, or a one- or two-element sequence of equal
    sides)."""
    if isinstance(size, numbers.Integral):
        return int(size)
    s = list(size)
    if len(s) == 1 or (len(s) == 2 and s[0] == s[1]):
        return int(s[0])
    raise ValueError(f"native=True: {_names(t)}({what}={tuple(s)}): only square outputs translate")


def translate(dataset: Any) -> Tuple[Any, Tuple[Any, ...], Optional[Tuple[Tuple[float, ...], Tuple[float, ...]]]]:
    """The files source, the transform and the normalization (``None`` for
    uint8 output) that run ``dataset`` natively; ``ValueError`` naming what
    does not translate."""
    from torchvision import datasets
    from torchvision.datasets import folder

    if not isinstance(dataset, datasets.DatasetFolder):
        raise ValueError(
            f"native=True: dataset is {_names(dataset)}; it translates torchvision's ImageFolder and DatasetFolder"
        )
    if dataset.loader not in (folder.default_loader, folder.pil_loader):
        raise ValueError(f"native=True: dataset.loader {getattr(dataset.loader, '__name__', dataset.loader)!r} "
                         "is not torchvision's default (PIL) loader")
    if getattr(dataset, "target_transform", None) is not None:
        raise ValueError("native=True: dataset.target_transform does not translate")
    tr = dataset.transform
    if tr is None:
        raise ValueError("native=True: dataset.transform is None (PIL images do not batch); give a Compose")
    steps = list(getattr(tr, "transforms", [tr]))
    geometry: Optional[Tuple[Any, ...]] = None
    resize: Any = None
    flip: Optional[float] = None
    scale: Optional[float] = None  # float output: 1/255 (scaled) or 1; None: uint8
    converted = False
    normalize: Optional[Tuple[Tuple[float, ...], Tuple[float, ...]]] = None
    for t in steps:
        name = _names(t)
        if name == "Resize":
            if geometry is not None or resize is not None:
                raise ValueError(f"native=True: {name} after another resize or crop does not translate")
            _bilinear(t)
            if getattr(t, "max_size", None) is not None:
                raise ValueError(f"native=True: Resize(max_size={t.max_size}) does not translate")
            size = t.size
            if isinstance(size, numbers.Integral):
                resize = int(size)
            elif len(size) == 1:
                resize = int(size[0])
            else:
                resize = (int(size[0]), int(size[1]))
        elif name == "CenterCrop":
            if resize is None or geometry is not None:
                raise ValueError("native=True: CenterCrop translates after a Resize (Resize(N) + CenterCrop(S))")
            geometry = ("eval", resize, _side(t, "size", t.size))
        elif name == "RandomResizedCrop":
            if resize is not None or geometry is not None:
                raise ValueError(f"native=True: {name} after another resize or crop does not translate")
            _bilinear(t)
            geometry = ("train", _side(t, "size", t.size), tuple(map(float, t.scale)), tuple(map(float, t.ratio)))
        elif name == "RandomHorizontalFlip":
            if geometry is None or geometry[0] != "train" or flip is not None:
                raise ValueError("native=True: RandomHorizontalFlip translates right after RandomResizedCrop")
            flip = float(t.p)
        elif name == "ToTensor":
            if converted:
                raise ValueError(f"native=True: {name} after another conversion")
            converted, scale = True, 1.0 / 255
        elif name in ("PILToTensor", "ToImage"):
            if converted:
                raise ValueError(f"native=True: {name} after another conversion")
            converted = True
        elif name == "ToDtype":
            if not converted or scale is not None:
                raise ValueError("native=True: ToDtype translates after ToImage or PILToTensor")
            if t.dtype is not torch.float32:
                raise ValueError(f"native=True: ToDtype(dtype={t.dtype}): only torch.float32 translates")
            scale = 1.0 / 255 if t.scale else 1.0
        elif name == "Normalize":
            if scale is None:
                raise ValueError("native=True: Normalize needs float images (after ToTensor or ToDtype)")
            if normalize is not None:
                raise ValueError("native=True: a second Normalize does not translate")
            k = 255 * scale
            mean = tuple(float(m) / k for m in t.mean)
            std = tuple(float(s) / k for s in t.std)
            if len(mean) != 3 or len(std) != 3:
                raise ValueError("native=True: Normalize needs three channel means and deviations")
            normalize = (mean, std)
        else:
            raise ValueError(f"native=True: transform {name} does not translate")
    if geometry is None:
        what = "Resize without a CenterCrop" if resize is not None else "no crop"
        raise ValueError(f"native=True: {what}; the transform needs Resize + CenterCrop or RandomResizedCrop")
    if not converted:
        raise ValueError("native=True: no ToTensor, PILToTensor or ToImage: PIL images do not batch")
    if geometry[0] == "train":
        transform: Tuple[Any, ...] = ("train", geometry[1], geometry[2], geometry[3], 0.0 if flip is None else flip)
    else:
        transform = geometry
    if scale is not None and normalize is None:
        # Float output without Normalize: x * scale.
        normalize = ((0.0, 0.0, 0.0), (1 / (255 * scale),) * 3)
    paths = [p for p, _ in dataset.samples]
    labels = [int(c) for _, c in dataset.samples]
    src = source.files(paths, labels, classes=list(dataset.classes))
    return src, transform, normalize


def loader(dataset: Any, *, batch_size: int, shuffle: bool, drop_last: bool, num_workers: int,
           generator: Optional[torch.Generator], pin_memory: bool, settings: Dict[str, Any]) -> Any:
    """The native loader for ``dataset`` (see ``translate``)."""
    src, transform, normalize = translate(dataset)
    # The seed is drawn from the generator (or torch's global RNG), as
    # torch's RandomSampler draws its order.
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
    p = Pipeline(src, batch_size=batch_size, shuffle=bool(shuffle), drop_last=drop_last, seed=seed,
                 workers=max(1, num_workers), output="torch", pin_memory=bool(pin_memory), **settings)
    p._transform = transform
    p._exif = False  # PIL's loader does not apply EXIF orientation
    side = transform[1] if transform[0] == "train" else transform[2]
    p.read().decode_image(transform=transform[0], size=side)
    if normalize is not None:
        p.normalize(*normalize)
    return p.build()
