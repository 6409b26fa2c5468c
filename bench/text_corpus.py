"""Writes a text corpus with no repeated line for bench/text_vs_torch.sh: the
docstrings of the Python standard library that runs it, one paragraph per
line (whitespace collapsed, lines under 20 characters and repeats left out),
in file order, up to LIMIT bytes. Natural technical English whose vocabulary
keeps growing with its size, as a real corpus's does — unlike a corpus
repeated whole, where every word after the first copy has been seen before.

  python bench/text_corpus.py [LIMIT=1500000] > corpus.txt
"""
import ast
import pathlib
import re
import sys
import sysconfig

limit = int(sys.argv[1]) if len(sys.argv) > 1 else 1_500_000
root = pathlib.Path(sysconfig.get_paths()["stdlib"])
seen, size = set(), 0
out = []
for path in sorted(root.rglob("*.py")):
    if {"site-packages", "test", "tests"} & set(path.parts):
        continue
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        continue
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for para in re.split(r"\n\s*\n", ast.get_docstring(node) or ""):
            line = " ".join(para.split())
            if len(line) < 20 or line in seen or size >= limit:
                continue
            seen.add(line)
            out.append(line)
            size += len(line.encode()) + 1
sys.stdout.write("\n".join(out) + "\n")
