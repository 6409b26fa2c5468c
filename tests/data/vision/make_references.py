"""Reference arrays for the vision tests, made with Pillow (libjpeg-turbo).

- <name>.npy: the decoded image, uint8 HWC RGB, EXIF orientation applied
  (Image.open -> ImageOps.exif_transpose -> convert("RGB")).
- eval_<name>.npy: torchvision's Resize(256, antialias=True) + CenterCrop(224)
  on the PIL image. On PIL images torchvision resizes with Pillow's bilinear
  filter (antialiased) and crops at round((h - 224) / 2), which is what this
  script does when torchvision is not installed; with torchvision it uses it.
Run: python3 make_references.py (from this folder). Odd-margin sizes, where
the crop origin is a half pixel rounded to even: make_eval_odd.py.
"""
import numpy as np
from PIL import Image, ImageOps

DECODE = ["baseline_420", "s444", "s422", "progressive", "gray", "cmyk", "restart", "exif_rotate6"]
EVAL = ["eval_landscape", "eval_portrait"]


def load(name):
    im = Image.open(name + (".png" if name == "rgb" else ".jpg"))
    im = ImageOps.exif_transpose(im)
    return im.convert("RGB")


def eval_transform(im):
    try:
        from torchvision import transforms

        t = transforms.Compose([transforms.Resize(256, antialias=True), transforms.CenterCrop(224)])
        return t(im)
    except ImportError:
        w, h = im.size
        if w <= h:
            nw, nh = 256, int(256 * h / w)
        else:
            nw, nh = int(256 * w / h), 256
        im = im.resize((nw, nh), Image.BILINEAR)
        left, top = int(round((nw - 224) / 2.0)), int(round((nh - 224) / 2.0))
        return im.crop((left, top, left + 224, top + 224))


for name in DECODE + ["rgb"]:
    np.save(name + ".npy", np.asarray(load(name), dtype=np.uint8))
for name in EVAL:
    np.save(name + ".npy", np.asarray(eval_transform(load(name)), dtype=np.uint8))
print("references written")
