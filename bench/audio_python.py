"""Python side of bench/audio_vs_python.sh: audio-seconds per second of
decode (+ resample to 16 kHz) + 80-band log-mel (n_fft 400, hop 160) over a
folder of files, whole files at a time, with
  - librosa in one process (soundfile decode, soxr resampling),
  - torchaudio in one process (soundfile decode — torchaudio.load now needs
    torchcodec —, functional.resample, transforms.MelSpectrogram with the
    same parameters),
  - a PyTorch DataLoader with 2 workers running the librosa code
    (BLAS/OpenMP threads limited to 1 per worker, persistent workers).
Each runs EPOCHS passes over the files; the best pass counts (the
DataLoader's first pass includes starting its workers).
Prints one JSON object.

  python bench/audio_python.py DIR [--workers 2] [--epochs 5]
"""
import argparse
import glob
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import librosa
import numpy as np
import soundfile as sf
import torch
import torchaudio

torch.set_num_threads(1)
ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--workers", type=int, default=2)
ap.add_argument("--epochs", type=int, default=5)
a = ap.parse_args()
files = sorted(glob.glob(os.path.join(a.dir, "**", "*.*"), recursive=True))
files = [f for f in files if f.endswith((".wav", ".flac"))]
SR = 16000


def librosa_one(path):
    y, sr = sf.read(path, dtype="float32", always_2d=True)
    y = y.mean(axis=1)
    if sr != SR:
        y = librosa.resample(y, orig_sr=sr, target_sr=SR)
    mel = librosa.feature.melspectrogram(y=y, sr=SR, n_fft=400, hop_length=160, n_mels=80,
                                         power=2.0, center=True, pad_mode="constant")
    return len(y) / SR, 10 * np.log10(np.maximum(mel, 1e-10))


mel_t = torchaudio.transforms.MelSpectrogram(sample_rate=SR, n_fft=400, hop_length=160, n_mels=80,
                                             power=2.0, center=True, pad_mode="constant",
                                             norm="slaney", mel_scale="slaney")


def torch_one(path):
    y, sr = sf.read(path, dtype="float32", always_2d=True)
    y = torch.from_numpy(y).mean(dim=1)
    if sr != SR:
        y = torchaudio.functional.resample(y, sr, SR)
    mel = mel_t(y)
    return y.shape[0] / SR, 10 * torch.log10(torch.clamp(mel, min=1e-10))


out = {"files": len(files)}
librosa_one(files[0]); torch_one(files[0])  # warm up (imports, caches)
for name, fn in [("librosa", librosa_one), ("torchaudio", torch_one)]:
    best = 0.0
    for _ in range(a.epochs):
        t0 = time.perf_counter()
        secs = sum(fn(f)[0] for f in files)
        best = max(best, secs / (time.perf_counter() - t0))
    out[name] = best
    out["audio_seconds"] = secs


class Files(torch.utils.data.Dataset):
    def __len__(self):
        return len(files)

    def __getitem__(self, i):
        s, m = librosa_one(files[i])
        return s, torch.from_numpy(m)


loader = torch.utils.data.DataLoader(Files(), batch_size=None, num_workers=a.workers,
                                     persistent_workers=True)
best = 0.0
for _ in range(a.epochs):
    t0 = time.perf_counter()
    secs = sum(s for s, _ in loader)
    best = max(best, secs / (time.perf_counter() - t0))
out["dataloader"] = best
print(json.dumps(out))
