"""`tokenizers`' ids and decoded text, for the C++ encoder's tests.

usage: tokenizers_ids.py OUTDIR TOKENIZER.json[,...] TEXT...
Writes OUTDIR/T-X.ids (uint32) and OUTDIR/T-X.decoded for each tokenizer T and text X (file
names without their extension): encode(text, add_special_tokens=False), as loco encodes
corpora, and decode(ids, skip_special_tokens=False).
"""
import os
import sys

import numpy as np
from tokenizers import Tokenizer


def stem(path):
    return os.path.splitext(os.path.basename(path))[0]


out, tokenizers, texts = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
for t in tokenizers:
    tok = Tokenizer.from_file(t)
    for x in texts:
        with open(x, encoding="utf-8", newline="") as f:
            ids = tok.encode(f.read(), add_special_tokens=False).ids
        base = os.path.join(out, stem(t) + "-" + stem(x))
        np.array(ids, dtype=np.uint32).tofile(base + ".ids")
        with open(base + ".decoded", "w", encoding="utf-8", newline="") as f:
            f.write(tok.decode(ids, skip_special_tokens=False))
