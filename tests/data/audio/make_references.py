"""Small audio files and librosa reference features for the audio pack's tests
(run from the repository root):

  python3 tests/data/audio/make_references.py

Writes three files (16 kHz 16-bit WAV, 22.05 kHz float WAV, 16 kHz stereo
16-bit FLAC), encodes the first 2.5 s of the embedded dataset's first
espeak-ng sentence (domains/audio/data/speech/speech_1.flac, made by
make_speech.sh there) as MP3 (lame -b 64) and Ogg Vorbis (oggenc -q 3), and
writes, for each, `<name>.mel.npy` / `<name>.logmel.npy`:
librosa.feature.melspectrogram(y, sr=<file rate>, n_fft=400, hop_length=160,
n_mels=80, power=2.0, center=True, pad_mode='constant') on the file as
soundfile decodes it (float32, channels averaged), and
10*log10(max(mel, 1e-10)).
"""
import os
import subprocess
import tempfile

import librosa
import numpy as np
import soundfile as sf

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(7)


def tone_chirp(sr, secs):
    t = np.arange(int(sr * secs)) / sr
    tone = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.15 * np.sin(2 * np.pi * 1320 * t)
    chirp = 0.3 * np.sin(2 * np.pi * (200 * t + (3000 - 200) * t * t / (2 * secs)))
    return (tone + chirp) * (0.7 + 0.3 * np.sin(2 * np.pi * 0.8 * t))


files = {
    "a_tone_16k.wav": (16000, tone_chirp(16000, 2.0)[:, None], "PCM_16"),
    "b_noise_22k.wav": (22050, (0.2 * rng.standard_normal(int(22050 * 1.3)))[:, None], "FLOAT"),
    "c_stereo_16k.flac": (
        16000,
        np.stack([tone_chirp(16000, 1.0), 0.3 * rng.standard_normal(16000)], axis=1),
        "PCM_16",
    ),
}
SPEECH = os.path.join(HERE, "..", "..", "..", "domains", "audio", "data", "speech", "speech_1.flac")
for name, (sr, data, subtype) in files.items():
    path = os.path.join(HERE, name)
    sf.write(path, np.clip(data, -1, 1).astype(np.float32), sr, subtype=subtype)
with tempfile.TemporaryDirectory() as tmp:
    wav = os.path.join(tmp, "speech.wav")
    y, sr = sf.read(SPEECH, dtype="int16")
    sf.write(wav, y[: int(2.5 * sr)], sr, subtype="PCM_16")
    subprocess.run(["lame", "--quiet", "-b", "64", wav, os.path.join(HERE, "d_speech_22k.mp3")], check=True)
    subprocess.run(["oggenc", "-Q", "-q", "3", "-o", os.path.join(HERE, "e_speech_22k.ogg"), wav], check=True)
for name in list(files) + ["d_speech_22k.mp3", "e_speech_22k.ogg"]:
    path = os.path.join(HERE, name)
    y, got_sr = sf.read(path, dtype="float32", always_2d=True)
    y = y.mean(axis=1).astype(np.float32)
    mel = librosa.feature.melspectrogram(
        y=y, sr=got_sr, n_fft=400, hop_length=160, n_mels=80, power=2.0,
        center=True, pad_mode="constant",
    ).astype(np.float32)
    logmel = (10 * np.log10(np.maximum(mel, 1e-10))).astype(np.float32)
    np.save(os.path.join(HERE, name + ".mel.npy"), mel)
    np.save(os.path.join(HERE, name + ".logmel.npy"), logmel)
    print(name, got_sr, len(y), mel.shape)
print("librosa", librosa.__version__)
