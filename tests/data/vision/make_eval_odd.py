"""Odd-margin eval fixtures and their torchvision references.

Photo-like JPEGs (smooth gradients, edges, texture) whose resized side minus
224 is odd, so the center crop origin is a half pixel that torchvision rounds
to even: 500x375 and 640x480 (resized to 341x256), 375x500 (256x341), and
1000x750 (341x256). For each, eval_odd_<w>x<h>.npy holds torchvision's
Resize(256, antialias=True) + CenterCrop(224) of the decoded PIL image.
Needs Pillow, numpy and torchvision. Run from this folder: python3 make_eval_odd.py
"""
import numpy as np
from PIL import Image, ImageDraw, ImageFilter
from torchvision import transforms

SIZES = [(500, 375), (375, 500), (640, 480), (1000, 750)]


def photo(w, h, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack(
        [
            128 + 100 * np.sin(x / (w / 5.0) + seed),
            128 + 90 * np.cos(y / (h / 4.0)),
            128 + 80 * np.sin((x + y) / 37.0),
        ],
        axis=-1,
    )
    noise = rng.normal(0, 18, size=(h, w, 3))
    im = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(im)
    for _ in range(40):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        r = int(rng.integers(5, max(6, w // 8)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            d.ellipse((x0 - r, y0 - r, x0 + r, y0 + r), fill=colour)
        else:
            d.line((x0, y0, x0 + r * 3, y0 - r), fill=colour, width=int(rng.integers(1, 6)))
    return im.filter(ImageFilter.SMOOTH)


t = transforms.Compose([transforms.Resize(256, antialias=True), transforms.CenterCrop(224)])
for i, (w, h) in enumerate(SIZES):
    name = f"eval_odd_{w}x{h}"
    photo(w, h, i).save(name + ".jpg", quality=90)
    im = Image.open(name + ".jpg").convert("RGB")
    np.save(name + ".npy", np.asarray(t(im), dtype=np.uint8))
print("odd-margin references written")
