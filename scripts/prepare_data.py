"""scripts/prepare-data: text, JSONL, Parquet or folders -> llm.c token files + tokenizer.json.

Run through scripts/prepare-data (the project's venv). See that script for the usage.
"""

import argparse
import gzip
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
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz")
PARQUET_SUFFIXES = (".parquet",)
# What one batch of a Parquet column should decode to: the reader's memory, whatever the file.
PARQUET_BATCH_BYTES = 4 << 20
PARQUET_BATCH_ROWS = (1, 8192)
JSON_TYPES = {bool: "a boolean", int: "a number", float: "a number", list: "an array",
              dict: "an object"}
# llm.c's headers: 256 int32, [0] magic, [1] version, [2] token count.
MAGIC_U16, VERSION_U16 = 20240520, 1
MAGIC_U32, VERSION_U32 = 20240801, 7


def fail(msg):
    print(f"prepare-data: {msg}", file=sys.stderr)
    sys.exit(2)


def kind_of(path):
    """An input's kind, by its name: a named *.json is read as JSON Lines too."""
    if path.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if path.endswith(JSONL_SUFFIXES + (".json",)):
        return "jsonl"
    return "text"


def folder_files(folder):
    """The inputs in a folder, recursively, in name order. Beside Parquet or JSONL files, text
    files are left out (a dataset's README.md is its card, not a document); so are hidden
    folders (.git, .cache)."""
    data, text = [], []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for n in names:
            if n.endswith(PARQUET_SUFFIXES + JSONL_SUFFIXES):
                data.append(os.path.join(root, n))
            elif n.endswith(TEXT_SUFFIXES):
                text.append(os.path.join(root, n))
    if data and text:
        print(
            f"prepare-data: {folder}: left out {len(text)} text files beside its Parquet/JSONL "
            f"files (name them with --input to take them)"
        )
    if not data and not text:
        fail(f"--input {folder}: no *.txt, *.md, *.jsonl(.gz), *.json.gz or *.parquet files")
    return sorted(data or text)


def input_files(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            files.extend(folder_files(p))
        elif os.path.isfile(p):
            files.append(p)
        else:
            fail(f"--input {p}: no such file or folder")
    return files


class Counts:
    """One input kind's part of the summary."""

    def __init__(self):
        self.files = self.documents = self.nulls = self.tokens = 0


def documents(files, field, limit, stats=None):
    """Yields (counts, text) for each document, streaming: a text file is one (read whole), a
    JSONL line is one, a Parquet row is one. Null values are skipped and counted. `stats`, a
    dict, gets a Counts per input kind."""
    readers = {"text": text_documents, "jsonl": jsonl_documents, "parquet": parquet_documents}
    for f in files:
        kind = kind_of(f)
        counts = Counts() if stats is None else stats.setdefault(kind, Counts())
        counts.files += 1
        for text in readers[kind](f, field, limit, counts):
            counts.documents += 1
            yield counts, text


def text_documents(path, field, limit, counts):
    """The file, one document: refused before it is read when it is over `limit` bytes
    (--max-document-mib), and read to at most limit + 1 bytes whatever its size said, so that
    no text file is ever held past the bound (a 1.5 GB .txt took 3.67 GB of memory before)."""
    try:
        size = os.path.getsize(path)
        if size > limit:
            fail(f"{path}: {size} bytes, a document over {limit} bytes (--max-document-mib): "
                 "split it, or raise the bound")
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            fail(f"{path}: grew past {limit} bytes while read (--max-document-mib)")
        yield data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{path}: not UTF-8 ({e})")
    except OSError as e:
        fail(f"{path}: cannot read ({e.strerror})")


def jsonl_documents(path, field, limit, counts):
    """One JSON object a line, read line by line (gzip-compressed too): no line over `limit`
    bytes is ever held. Blank lines are skipped; anything else that is not an object with the
    string field fails naming file:line, rather than losing data silently."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            n = 0
            while line := fh.readline(limit + 2):
                n += 1
                if len(line.rstrip(b"\r\n")) > limit:
                    fail(f"{path}:{n}: a line over {limit} bytes (--max-document-mib)")
                if not line.strip():
                    continue
                text = jsonl_field(line, f"{path}:{n}", field)
                if text is None:
                    counts.nulls += 1
                else:
                    yield text
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        fail(f"{path}: cannot read ({e})")


def jsonl_field(line, where, field):
    """The string `field` of one JSONL line, or None for a null."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        fail(f"{where}: not UTF-8 ({e})")
    except (ValueError, RecursionError) as e:
        fail(f"{where}: not JSON ({str(e)[:200]})")
    if not isinstance(obj, dict):
        fail(f"{where}: not a JSON object")
    if field not in obj:
        fail(f"{where}: no field '{field}' (--field); its fields: {listed(obj.keys())}")
    text = obj[field]
    if text is not None and not isinstance(text, str):
        fail(f"{where}: field '{field}' is {JSON_TYPES[type(text)]}, not a string (--field)")
    if text is not None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            fail(f"{where}: field '{field}' holds a lone surrogate escape, not text")
    return text


def listed(names, most=20):
    names = list(names)
    more = f", and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(repr(n)[:80] for n in names[:most]) + more


def parquet_documents(path, field, limit, counts):
    """The string column `field`, batch by batch: only that column is read, in batches of
    about PARQUET_BATCH_BYTES, never a whole row group, column or file."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError:
        fail(f"{path}: reading Parquet needs pyarrow (scripts/setup installs it)")
    try:
        # buffer_size reads a row group's column chunk page by page, not whole; pre_buffer (on
        # by default) would read every row group's chunk ahead.
        pf = pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
        rows = parquet_batch_rows(pf, path, field, pa)
        row = 0
        for batch in pf.iter_batches(rows, columns=[field], use_threads=False):
            column = batch.column(0)
            counts.nulls += column.null_count
            longest = pc.max(pc.binary_length(column)).as_py() or 0
            if longest > limit:
                at = row + pc.index(pc.binary_length(column), longest).as_py()
                fail(f"{path}: row {at}: a '{field}' value over {limit} bytes (--max-document-mib)")
            yield from (t for t in column.to_pylist() if t is not None)
            row += len(column)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
        fail(f"{path}: cannot read as Parquet ({str(e)[:300]})")


def parquet_batch_rows(pf, path, field, pa):
    """Checks that `field` is one string column of the file; the rows of a batch of about
    PARQUET_BATCH_BYTES, by the column's mean size in the file's metadata."""
    schema = pf.schema_arrow
    if schema.names.count(field) != 1:
        have = "no" if field not in schema.names else "more than one"
        fail(f"{path}: {have} column '{field}' (--field); its columns: {listed(schema.names)}")
    kind = schema.field(field).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_string_view(kind)):
        fail(f"{path}: column '{field}' is {schema.field(field).type}, not strings (--field)")
    md = pf.metadata
    leaf = [md.schema.column(i).path for i in range(md.num_columns)].index(field)
    groups = range(md.num_row_groups)
    size = sum(md.row_group(g).column(leaf).total_uncompressed_size for g in groups)
    per_row = max(1, size // max(1, md.num_rows))
    return min(max(PARQUET_BATCH_BYTES // per_row, PARQUET_BATCH_ROWS[0]), PARQUET_BATCH_ROWS[1])


def train_tokenizer(docs, vocab):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((text for _, text in docs), trainer)
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


def parse_args():
    ap = argparse.ArgumentParser(prog="scripts/prepare-data", description=__doc__)
    ap.add_argument("--input", action="extend", nargs="+", required=True,
                    help="text, JSONL or Parquet files or folders of them")
    ap.add_argument("--field", "--jsonl-field", dest="field", default="text",
                    help="the documents' JSONL field or Parquet column")
    ap.add_argument("--max-document-mib", type=int, default=64,
                    help="the longest JSONL line or Parquet value, in MiB")
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
    if not a.field:
        fail("--field: must name a JSONL field or Parquet column, got ''")
    if not 1 <= a.max_document_mib <= 2047:
        fail(f"--max-document-mib: must be in [1, 2047], got {a.max_document_mib}")
    a.max_document_bytes = a.max_document_mib << 20
    return a


def tokenizer_for(a, files):
    """The --tokenizer, or one trained on the inputs; saved as OUT/tokenizer.json."""
    tok_path = os.path.join(a.out, "tokenizer.json")
    if a.tokenizer:
        try:
            tok = Tokenizer.from_file(a.tokenizer)
        except Exception as e:  # tokenizers raises its own exception types
            fail(f"--tokenizer {a.tokenizer}: cannot load ({e})")
        if os.path.abspath(a.tokenizer) != os.path.abspath(tok_path):
            shutil.copyfile(a.tokenizer, tok_path)
    else:
        tok = train_tokenizer(documents(files, a.field, a.max_document_bytes), a.vocab)
        tok.save(tok_path)
    return tok, tok_path


def write_tokens(a, files, tok, wide):
    """Each document is the end-of-text id then its ids. The validation split: the first
    val_fraction of the text, by characters, cut at a line. Returns the writers and the
    counts per input kind."""
    eot = next((tok.token_to_id(t) for t in EOT_TOKENS if tok.token_to_id(t) is not None), None)
    if eot is None:
        print(f"prepare-data: the tokenizer has none of {', '.join(EOT_TOKENS)}; "
              "documents are not separated")
    total = sum(len(d) for _, d in documents(files, a.field, a.max_document_bytes))
    if total == 0:
        fail("the inputs hold no text")
    val_chars = int(total * a.val_fraction)
    val = ShardWriter(a.out, a.name, "val", a.shard_tokens, wide)
    train = ShardWriter(a.out, a.name, "train", a.shard_tokens, wide)
    stats = {}
    seen = 0

    def emit(writer, counts, text):
        ids = tok.encode(text, add_special_tokens=False).ids
        if eot is not None:
            writer.add([eot])
        writer.add(ids)
        counts.tokens += len(ids) + (eot is not None)

    for counts, doc in documents(files, a.field, a.max_document_bytes, stats):
        if seen + len(doc) <= val_chars:
            emit(val, counts, doc)
        elif seen < val_chars:
            cut = doc.find("\n", val_chars - seen)
            cut = len(doc) if cut < 0 else cut + 1
            emit(val, counts, doc[:cut])
            if cut < len(doc):
                emit(train, counts, doc[cut:])
        else:
            emit(train, counts, doc)
        seen += len(doc)
    val.flush()
    train.flush()
    return val, train, stats


def main():
    a = parse_args()
    files = input_files(a.input)
    os.makedirs(a.out, exist_ok=True)
    tok, tok_path = tokenizer_for(a, files)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    wide = vocab > 65536
    val, train, stats = write_tokens(a, files, tok, wide)
    if not train.written:
        fail("no training tokens (lower --val-fraction or give more text)")
    for path, n in val.written + train.written:
        print(f"prepare-data: {path} {n} tokens ({'uint32' if wide else 'uint16'})")
    for kind, c in stats.items():
        nulls = f" ({c.nulls} null values skipped)" if c.nulls else ""
        print(f"prepare-data: {kind}: {c.files} files, {c.documents} documents{nulls}, "
              f"{c.tokens} tokens")
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
