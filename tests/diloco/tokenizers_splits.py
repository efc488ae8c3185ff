"""`tokenizers`' Split (behavior Isolated) of a text by each pattern, for the C++ tests.

usage: tokenizers_splits.py OUT.json TEXT PATTERNS.json
PATTERNS.json is a list of patterns; writes {pattern: [piece, ...]} (pieces as
`pre_tokenize_str` gives them).
"""
import json
import sys

from tokenizers import Regex, pre_tokenizers

out, text_path = sys.argv[1], sys.argv[2]
with open(sys.argv[3], encoding="utf-8") as f:
    patterns = json.load(f)
with open(text_path, encoding="utf-8", newline="") as f:
    text = f.read()
splits = {
    p: [s for s, _ in pre_tokenizers.Split(Regex(p), behavior="isolated").pre_tokenize_str(text)]
    for p in patterns
}
with open(out, "w", encoding="utf-8") as f:
    json.dump(splits, f, ensure_ascii=False)
