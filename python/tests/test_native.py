"""ferrofeed.torch.DataLoader(..., native=True) (PYTHON.md, "native=True"):
torchvision's ImageFolder and transforms run as a native pipeline."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
from PIL import Image  # noqa: E402
from torchvision import datasets  # noqa: E402
from torchvision import transforms as T  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from ferrofeed.torch import DataLoader  # noqa: E402


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """3 classes × 4 JPEGs of 320×260 and 260×300 (smooth gradients and
    noise), large enough that the eval crop is decoded at full scale."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for c in range(3):
        d = root / f"c{c}"
        d.mkdir()
        for i in range(4):
            w, h = (320, 260) if i % 2 == 0 else (260, 300)
            y, x = np.mgrid[0:h, 0:w]
            img = np.stack([x * 255 // w, y * 255 // h, (x + y + 40 * c) % 256], -1).astype(np.float32)
            img += rng.normal(0, 12, img.shape)
            Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(d / f"{i}.jpg", quality=92)
    return str(root)


def psnr(a, b, peak):
    m = float(((a.double() - b.double()) ** 2).mean())
    return 10 * np.log10(peak**2 / max(m, 1e-12))


EVALS = [
    ("v1 ToTensor+Normalize", T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                                        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])),
    ("v1 PILToTensor", T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])),
    ("v2 ToImage+ToDtype", v2.Compose([v2.Resize(256), v2.CenterCrop(224), v2.ToImage(),
                                       v2.ToDtype(torch.float32, scale=True)])),
    ("v2 exact resize", v2.Compose([v2.ToImage(), v2.Resize((240, 250)), v2.CenterCrop(224),
                                    v2.ToDtype(torch.float32, scale=True),
                                    v2.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])),
]


@pytest.mark.parametrize("name,tf", EVALS, ids=[e[0] for e in EVALS])
def test_eval_transforms_match_torchvision(photos, name, tf):
    ds = datasets.ImageFolder(photos, tf)
    want = list(torch.utils.data.DataLoader(ds, batch_size=5))
    got = list(DataLoader(ds, batch_size=5, num_workers=2, native=True))
    assert len(got) == len(want) == 3
    for (xw, yw), (xg, yg) in zip(want, got):
        assert isinstance(xg, torch.Tensor) and xg.dtype == xw.dtype and xg.shape == xw.shape
        assert xg.is_contiguous()
        assert torch.equal(yg, yw) and yg.dtype == torch.int64
        if xw.dtype == torch.uint8:
            p = psnr(xg, xw, 255)
        else:
            # On the [0, 1] scale of the images before Normalize.
            mean, std = _norm(tf)
            p = psnr(xg * std + mean, xw * std + mean, 1.0)
        assert p >= 50, f"{name}: PSNR {p:.1f} dB"


def _norm(tf):
    for t in tf.transforms:
        if type(t).__name__ == "Normalize":
            return (torch.tensor(t.mean)[:, None, None], torch.tensor(t.std)[:, None, None])
    return torch.zeros(3, 1, 1), torch.ones(3, 1, 1)


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """40 copies of a 256×256 PNG whose red is x and green is y: a crop's
    box and flip can be read off the output's corners."""
    root = tmp_path_factory.mktemp("grid")
    (root / "a").mkdir()
    y, x = np.mgrid[0:256, 0:256]
    img = Image.fromarray(np.stack([x, y, np.zeros_like(x)], -1).astype(np.uint8))
    for i in range(40):
        img.save(root / "a" / f"{i:02}.png")
    return str(root), img


def boxes(images):
    """(area fraction, aspect ratio, flipped) of each output of a crop of
    the grid."""
    out = []
    for im in images:
        im = im.double()
        r, g = im[0], im[1]
        n = im.shape[-1]
        w = abs(float(r[:, -1].mean() - r[:, 0].mean())) * n / (n - 1)
        h = float(g[-1, :].mean() - g[0, :].mean()) * n / (n - 1)
        out.append((w * h / 256**2, w / max(h, 1e-9), float(r[:, -1].mean()) < float(r[:, 0].mean())))
    return np.array(out)


def ks(a, b):
    """The two-sample Kolmogorov–Smirnov statistic."""
    a, b = np.sort(a), np.sort(b)
    xs = np.concatenate([a, b])
    fa = np.searchsorted(a, xs, side="right") / len(a)
    fb = np.searchsorted(b, xs, side="right") / len(b)
    return float(np.abs(fa - fb).max())


@pytest.mark.parametrize("scale,ratio,p", [((0.08, 1.0), (3 / 4, 4 / 3), 0.5), ((0.4, 0.9), (0.5, 1.0), 0.25),
                                           ((0.08, 1.0), (3 / 4, 4 / 3), None)])
def test_train_transforms_draw_from_torchvisions_distributions(grid, scale, ratio, p):
    root, img = grid
    steps = [T.RandomResizedCrop(48, scale=scale, ratio=ratio)]
    if p is not None:
        steps.append(T.RandomHorizontalFlip(p))
    tf = T.Compose(steps + [T.PILToTensor()])
    torch.manual_seed(0)
    want = boxes([tf(img) for _ in range(400)])
    loader = DataLoader(datasets.ImageFolder(root, tf), batch_size=40, shuffle=True, num_workers=2, native=True,
                        generator=torch.Generator().manual_seed(1))
    got = boxes([x for _ in range(10) for b, _ in loader for x in b])
    assert len(got) == 400
    # Two-sample KS at α = 0.001 for 400 against 400: D < 0.138.
    for col, what in ((0, "crop area"), (1, "aspect ratio")):
        d = ks(got[:, col], want[:, col])
        assert d < 0.138, f"{what}: KS D = {d:.3f}"
    rate = got[:, 2].mean()
    want_rate = 0.0 if p is None else p
    assert abs(rate - want_rate) < 0.1, f"flip rate {rate:.3f}, want {want_rate}"
    assert abs(rate - want[:, 2].mean()) < 0.12


def test_batches_shuffle_and_epochs_as_a_dataloader_does(photos):
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()])
    ds = datasets.ImageFolder(photos, tf)
    loader = DataLoader(ds, batch_size=5, shuffle=True, num_workers=2, native=True, drop_last=True,
                        generator=torch.Generator().manual_seed(3))
    assert len(loader) == len(torch.utils.data.DataLoader(ds, batch_size=5, drop_last=True)) == 2
    e0 = [y.tolist() for _, y in loader]
    e1 = [y.tolist() for _, y in loader]
    assert len(e0) == 2 and all(len(b) == 5 for b in e0)
    assert e0 != e1, "each epoch its own order"
    x, _ = next(iter(loader))
    assert x.dtype == torch.float32 and 0 <= float(x.min()) and float(x.max()) <= 1
    again = DataLoader(ds, batch_size=5, shuffle=True, num_workers=1, native=True, drop_last=True,
                       generator=torch.Generator().manual_seed(3))
    assert [y.tolist() for _, y in again] == e0, "the same generator, the same batches, for any workers"


@pytest.mark.parametrize("tf,named", [
    (T.Compose([T.RandomRotation(10), T.ToTensor()]), "RandomRotation"),
    (T.Compose([T.Resize(64), T.ToTensor()]), "Resize without a CenterCrop"),
    (T.Compose([T.Resize(64, interpolation=T.InterpolationMode.NEAREST), T.CenterCrop(32), T.ToTensor()]),
     "interpolation"),
    (T.Compose([T.RandomResizedCrop((32, 48)), T.ToTensor()]), "only square"),
    (T.Compose([T.RandomResizedCrop(32)]), "no ToTensor"),
    (T.Compose([T.RandomResizedCrop(32), T.PILToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)]), "Normalize"),
    (v2.Compose([v2.RandomResizedCrop(32), v2.ToImage(), v2.ToDtype(torch.float16, scale=True)]), "float16"),
])
def test_what_does_not_translate_is_a_value_error_naming_it(photos, tf, named):
    with pytest.raises(ValueError, match=named):
        DataLoader(datasets.ImageFolder(photos, tf), batch_size=4, native=True)


def test_datasets_and_arguments_that_do_not_translate_are_named(photos):
    tf = T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor()])
    with pytest.raises(ValueError, match="target_transform"):
        DataLoader(datasets.ImageFolder(photos, tf, target_transform=lambda y: y), batch_size=4, native=True)
    with pytest.raises(ValueError, match="loader"):
        DataLoader(datasets.ImageFolder(photos, tf, loader=lambda p: Image.open(p).convert("RGB")), batch_size=4,
                   native=True)
    with pytest.raises(ValueError, match="dataset is TensorDataset"):
        DataLoader(torch.utils.data.TensorDataset(torch.zeros(4)), batch_size=4, native=True)
    with pytest.raises(ValueError, match="sampler"):
        DataLoader(datasets.ImageFolder(photos, tf), batch_size=4, native=True,
                   sampler=torch.utils.data.SequentialSampler(range(12)))
    with pytest.raises(ValueError, match="collate_fn"):
        DataLoader(datasets.ImageFolder(photos, tf), batch_size=4, native=True, collate_fn=lambda b: b)
