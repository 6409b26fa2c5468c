"""Reference token ids for the embedded corpus from the Python `tokenizers`
package (run from the repository root):

  python3 tests/data/text/make_references.py

Writes corpus_ids.npy (int32, every line's ids concatenated) and
corpus_offsets.npy (int64, line i is ids[offsets[i]:offsets[i+1]]), for the
embedded tokenizer with truncation to 512 tokens, special tokens added, no
padding; empty and whitespace-only lines are left out as the corpus reader does.
"""
import os

import numpy as np
import tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "..", "domains", "text", "data")

tok = tokenizers.Tokenizer.from_file(os.path.join(DATA, "tokenizer.json"))
tok.no_padding()
tok.enable_truncation(max_length=512)
with open(os.path.join(DATA, "corpus.txt"), encoding="utf-8") as f:
    lines = [l.rstrip("\n").removesuffix("\r") for l in f]
lines = [l for l in lines if l.strip()]
encs = tok.encode_batch(lines)
ids = np.concatenate([np.asarray(e.ids, dtype=np.int32) for e in encs])
offsets = np.zeros(len(encs) + 1, dtype=np.int64)
offsets[1:] = np.cumsum([len(e.ids) for e in encs])
np.save(os.path.join(HERE, "corpus_ids.npy"), ids)
np.save(os.path.join(HERE, "corpus_offsets.npy"), offsets)
print(f"tokenizers {tokenizers.__version__}: {len(lines)} lines, {len(ids)} tokens")
