"""scripts/prepare-data: text, JSONL or folders -> llm.c token files + tokenizer.json.

Run through scripts/prepare-data (the project's venv). See that script for the usage.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"
# The end of a document in the tokenizers a user brings: GPT-2's, Llama 3's, SentencePiece's.
EOT_TOKENS = (EOT, "<|end_of_text|>", "</s>")
TEXT_SUFFIXES = (".txt", ".md", ".text")
# llm.c's headers: 256 int32, [0] magic, [1] version, [2] token count.
MAGIC_U16, VERSION_U16 = 20240520, 1
MAGIC_U32, VERSION_U32 = 20240801, 7


def fail(msg):
    print(f"prepare-data: {msg}", file=sys.stderr)
    sys.exit(2)


def input_files(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = []
            for root, _, names in os.walk(p):
                for n in names:
                    if n.endswith(TEXT_SUFFIXES) or n.endswith(".jsonl"):
                        found.append(os.path.join(root, n))
            if not found:
                fail(f"--input {p}: no *.txt, *.md or *.jsonl files in the folder")
            files.extend(sorted(found))
        elif os.path.isfile(p):
            files.append(p)
        else:
            fail(f"--input {p}: no such file or folder")
    return files


def documents(files, field):
    """Yields the documents: a text file is one, a JSONL line is one."""
    for f in files:
        try:
            if f.endswith(".jsonl"):
                with open(f, encoding="utf-8") as fh:
                    for n, line in enumerate(fh, 1):
                        if not line.strip():
                            continue
                        try:
                            obj = json.loads(line)
                        except json.JSONDecodeError as e:
                            fail(f"{f}:{n}: not JSON ({e})")
                        if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
                            fail(f"{f}:{n}: no string field '{field}' (--jsonl-field)")
                        yield obj[field]
            else:
                with open(f, encoding="utf-8") as fh:
                    yield fh.read()
        except UnicodeDecodeError as e:
            fail(f"{f}: not UTF-8 ({e})")


def train_tokenizer(files, field, vocab):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(documents(files, field), trainer)
    return tok


class ShardWriter:
    """Writes NAME_SPLIT_000000.bin, ... of at most `per_shard` tokens each."""

    def __init__(self, out, name, split, per_shard, wide):
        self.out, self.name, self.split, self.per_shard = out, name, split, per_shard
        self.dtype = np.uint32 if wide else np.uint16
        self.magic, self.version = (MAGIC_U32, VERSION_U32) if wide else (MAGIC_U16, VERSION_U16)
        self.buf = np.empty(per_shard, dtype=self.dtype)
        self.fill = 0
        self.index = 0
        self.written = []

    def add(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        while len(ids):
            take = min(len(ids), self.per_shard - self.fill)
            self.buf[self.fill : self.fill + take] = ids[:take]
            self.fill += take
            ids = ids[take:]
            if self.fill == self.per_shard:
                self.flush()

    def flush(self):
        if self.fill == 0:
            return
        path = os.path.join(self.out, f"{self.name}_{self.split}_{self.index:06d}.bin")
        header = np.zeros(256, dtype=np.int32)
        header[0], header[1], header[2] = self.magic, self.version, self.fill
        tmp = path + ".tmp"
        with open(tmp, "wb") as fh:
            fh.write(header.tobytes())
            fh.write(self.buf[: self.fill].tobytes())
        os.replace(tmp, path)
        self.written.append((path, self.fill))
        self.index += 1
        self.fill = 0


def main():
    ap = argparse.ArgumentParser(prog="scripts/prepare-data", description=__doc__)
    ap.add_argument("--input", action="append", required=True, help="text/JSONL file or folder")
    ap.add_argument("--jsonl-field", default="text", help="the document's field in JSONL lines")
    ap.add_argument("--out", required=True, help="folder for the token files and tokenizer.json")
    ap.add_argument("--tokenizer", help="an existing tokenizer.json to encode with")
    ap.add_argument("--train-tokenizer", action="store_true", help="train a byte-level BPE")
    ap.add_argument("--vocab", type=int, default=0, help="vocabulary of the trained BPE")
    ap.add_argument("--val-fraction", type=float, default=0.01)
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    ap.add_argument("--name", default="data", help="prefix of the token files")
    a = ap.parse_args()

    if bool(a.tokenizer) == bool(a.train_tokenizer):
        fail("give exactly one of --tokenizer FILE and --train-tokenizer --vocab N")
    if a.train_tokenizer and not 257 <= a.vocab <= 1 << 21:
        fail(f"--vocab: must be in [257, {1 << 21}] with --train-tokenizer, got {a.vocab}")
    if not 0 <= a.val_fraction < 0.5:
        fail(f"--val-fraction: must be in [0, 0.5), got {a.val_fraction}")
    if a.shard_tokens < 1024:
        fail(f"--shard-tokens: must be >= 1024, got {a.shard_tokens}")
    if not a.name or "/" in a.name or "val" in a.name or "train" in a.name:
        fail(f"--name: a file-name prefix without '/', 'val' or 'train', got '{a.name}'")
    files = input_files(a.input)
    os.makedirs(a.out, exist_ok=True)

    if a.tokenizer:
        try:
            tok = Tokenizer.from_file(a.tokenizer)
        except Exception as e:  # tokenizers raises its own exception types
            fail(f"--tokenizer {a.tokenizer}: cannot load ({e})")
    else:
        tok = train_tokenizer(files, a.jsonl_field, a.vocab)
    tok_path = os.path.join(a.out, "tokenizer.json")
    if a.tokenizer:
        if os.path.abspath(a.tokenizer) != os.path.abspath(tok_path):
            shutil.copyfile(a.tokenizer, tok_path)
    else:
        tok.save(tok_path)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eot = next((tok.token_to_id(t) for t in EOT_TOKENS if tok.token_to_id(t) is not None), None)
    if eot is None:
        print(f"prepare-data: the tokenizer has none of {', '.join(EOT_TOKENS)}; "
              "documents are not separated")
    wide = vocab > 65536

    # The validation split: the first val_fraction of the text, by characters, cut at a line.
    total = sum(len(d) for d in documents(files, a.jsonl_field))
    if total == 0:
        fail("the inputs hold no text")
    val_chars = int(total * a.val_fraction)
    val = ShardWriter(a.out, a.name, "val", a.shard_tokens, wide)
    train = ShardWriter(a.out, a.name, "train", a.shard_tokens, wide)
    seen = 0

    def emit(writer, text, first):
        ids = tok.encode(text, add_special_tokens=False).ids
        if first and eot is not None:
            writer.add([eot])
        writer.add(ids)

    for doc in documents(files, a.jsonl_field):
        if seen + len(doc) <= val_chars:
            emit(val, doc, True)
        elif seen < val_chars:
            cut = doc.find("\n", val_chars - seen)
            cut = len(doc) if cut < 0 else cut + 1
            emit(val, doc[:cut], True)
            if cut < len(doc):
                emit(train, doc[cut:], True)
        else:
            emit(train, doc, True)
        seen += len(doc)
    val.flush()
    train.flush()
    if not train.written:
        fail("no training tokens (lower --val-fraction or give more text)")
    for path, n in val.written + train.written:
        print(f"prepare-data: {path} {n} tokens ({'uint32' if wide else 'uint16'})")
    n_train = sum(n for _, n in train.written)
    n_val = sum(n for _, n in val.written)
    print(f"prepare-data: {tok_path} vocabulary {vocab}")
    print(f"prepare-data: {n_train} training tokens, {n_val} validation tokens")
    print(
        f"prepare-data: job file: model: {{vocab: {vocab}}}, "
        f"data: {{format: tokens, dir: {a.out}, tokenizer: {tok_path}, "
        f"shards: >= {len(train.written)}}}"
    )


if __name__ == "__main__":
    main()
