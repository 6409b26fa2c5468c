#!/usr/bin/env bash
# Speech for the embedded audio dataset: three sentences spoken by espeak-ng
# (22.05 kHz, 16-bit mono, so the default 16 kHz pipeline resamples them),
# stored as FLAC. Run from the repository root; needs espeak-ng and flac
# (Debian: apt-get install espeak-ng flac). espeak-ng 1.51 writes the same
# bytes for the same text, voice and settings.
set -euo pipefail
OUT=domains/audio/data/speech
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
say() { # name voice speed pitch text
  espeak-ng -v "$2" -s "$3" -p "$4" -w "$TMP/$1.wav" "$5"
  flac -s --best -f -o "$OUT/$1.flac" "$TMP/$1.wav"
}
mkdir -p "$OUT"
say speech_1 en-us 165 50 "A data loader keeps the accelerator fed: it reads, decodes and batches samples while the model trains."
say speech_2 en-gb 150 60 "Seven slim swans swam south, singing softly in the summer sun."
say speech_3 en-us 175 30 "Numbers too: three point one four one five nine, and twenty twenty six."
ls -l "$OUT"
