"""Small datasets for the package's tests, written with Pillow and the
standard library into a temporary folder per session."""

import math
import os
import struct
import wave

import tempfile

import pytest

# Embedded datasets and token caches go to a folder of this session's own.
os.environ["FERROFEED_CACHE_DIR"] = tempfile.mkdtemp(prefix="ferrofeed-test-cache-")


@pytest.fixture(scope="session")
def vision_dir(tmp_path_factory):
    """An ImageFolder tree: 3 classes × 8 JPEGs of varied sizes."""
    from PIL import Image

    root = tmp_path_factory.mktemp("vision")
    for c in range(3):
        d = root / f"class{c}"
        d.mkdir()
        for i in range(8):
            w, h = 96 + 8 * i, 80 + 4 * c
            img = Image.new("RGB", (w, h))
            px = img.load()
            for y in range(h):
                for x in range(w):
                    px[x, y] = ((x * 7 + c * 50) % 256, (y * 5 + i * 20) % 256, (x + y) % 256)
            img.save(d / f"img{i}.jpg", quality=90)
    return root


@pytest.fixture
def corrupt_vision_dir(tmp_path, vision_dir):
    """The vision tree with one file that is not an image (sample 0 of class1)."""
    import shutil

    root = tmp_path / "corrupt"
    shutil.copytree(vision_dir, root)
    (root / "class1" / "img0.jpg").write_bytes(b"\xff\xd8 this is not a JPEG")
    return root


@pytest.fixture(scope="session")
def text_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("text") / "corpus.txt"
    words = "the quick brown fox jumps over a lazy dog while data loaders keep accelerators fed".split()
    lines = [" ".join(words[(i * 3) % len(words):] + words[: i % 7]) for i in range(200)]
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.fixture(scope="session")
def audio_dir(tmp_path_factory):
    """Five 16 kHz mono WAV tones of 1.5–3.5 s."""
    root = tmp_path_factory.mktemp("audio")
    rate = 16000
    for i in range(5):
        n = int(rate * (1.5 + 0.5 * i))
        with wave.open(str(root / f"tone{i}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(rate)
            frames = b"".join(
                struct.pack("<h", int(12000 * math.sin(2 * math.pi * (220 + 110 * i) * t / rate)))
                for t in range(n)
            )
            w.writeframes(frames)
    return root


@pytest.fixture(autouse=True)
def _no_rank_env(monkeypatch):
    """Tests choose their own rank; torchrun's variables from outside would change lengths."""
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(v, raising=False)
