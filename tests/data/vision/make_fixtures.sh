#!/usr/bin/env bash
# Regenerates the decoder edge-case fixtures (needs ImageMagick, cjpeg from
# libjpeg-turbo-progs, Python with Pillow and numpy, and the ferrofeed binary
# for the two eval images).
# Usage: bash tests/data/vision/make_fixtures.sh [path/to/ferrofeed]
set -euo pipefail
cd "$(dirname "$0")"
FF=${1:-../../../target/release/ferrofeed}
python3 - <<'PY'
from PIL import Image, ImageDraw
import random
random.seed(7)
im = Image.new("RGB", (120, 80))
px = im.load()
for y in range(80):
    for x in range(120):
        px[x, y] = (2 * x, 3 * y, (x * y) % 256)
d = ImageDraw.Draw(im)
for _ in range(12):
    x, y = random.randrange(120), random.randrange(80)
    r = random.randrange(4, 25)
    d.ellipse((x - r, y - r, x + r, y + r), fill=tuple(random.randrange(256) for _ in range(3)))
im.save("source.png")
PY
convert source.png -quality 90 -sampling-factor 2x2 baseline_420.jpg
convert source.png -quality 90 -sampling-factor 1x1 s444.jpg
convert source.png -quality 90 -sampling-factor 2x1 s422.jpg
convert source.png -quality 90 -interlace Plane progressive.jpg
convert source.png -quality 90 -colorspace Gray gray.jpg
convert source.png -quality 90 -colorspace CMYK cmyk.jpg
# Restart markers every MCU row (cjpeg from libjpeg-turbo-progs).
convert source.png ppm:- | cjpeg -quality 90 -restart 1 > restart.jpg
python3 - <<'PY'
# Pixels stored rotated 90° counter-clockwise with EXIF orientation 6
# ("rotate 90° clockwise to display"): upright, it is source.png again.
from PIL import Image
exif = Image.Exif()
exif[0x0112] = 6
Image.open("source.png").rotate(90, expand=True).save("exif_rotate6.jpg", quality=90, exif=exif)
PY
cp source.png rgb.png
# Two photo-sized images for the eval (Resize 256 + CenterCrop 224) check.
tmp=$(mktemp -d)
"$FF" make-dataset vision "$tmp/ds" --count 2 --seed 11 >/dev/null
cp "$tmp/ds/class_00/img_000000.jpg" eval_landscape.jpg
convert "$tmp/ds/class_01/img_000001.jpg" -rotate 90 -quality 90 -sampling-factor 2x2 eval_portrait.jpg
rm -rf "$tmp"
# Huffman tables fitted to the image (only the symbols it uses).
djpeg eval_landscape.jpg | cjpeg -quality 85 -optimize > optimized.jpg
# Red at both edges, blue in the middle, tables fitted to it: its chroma DC
# table cannot code an edge-to-middle jump in one difference.
python3 - <<'PY'
from PIL import Image
W, H = 256, 64
im = Image.new("RGB", (W, H))
px = im.load()
for y in range(H):
    for x in range(W):
        t = 1 - abs(2 * x / (W - 1) - 1)
        px[x, y] = (round(230 * (1 - t)), 20, round(230 * t))
im.save("swing.ppm")
PY
cjpeg -quality 90 -optimize swing.ppm > chroma_swing.jpg
rm swing.ppm
# Hostile inputs.
head -c $(( $(stat -c %s baseline_420.jpg) / 2 )) baseline_420.jpg > truncated.jpg
: > empty.jpg
printf 'this is not an image, whatever its name says\n' > not_an_image.jpg
python3 - <<'PY'
# A valid JPEG whose frame header claims 65535x65535 pixels.
data = bytearray(open("baseline_420.jpg", "rb").read())
i = 2
while True:
    assert data[i] == 0xFF
    marker, length = data[i + 1], int.from_bytes(data[i + 2:i + 4], "big")
    if marker in (0xC0, 0xC1, 0xC2):
        data[i + 5:i + 7] = (65535).to_bytes(2, "big")
        data[i + 7:i + 9] = (65535).to_bytes(2, "big")
        break
    i += 2 + length
open("bomb_65535.jpg", "wb").write(data)
PY
python3 make_references.py
rm -f source.png
