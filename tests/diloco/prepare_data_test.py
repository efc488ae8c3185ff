"""scripts/prepare-data on a user's dataset: Parquet and JSONL as Hugging Face stores them.

The token files hold, document after document, the end-of-text id then `tokenizers`' ids of
the document (a tokenizer trained here): the same whether the documents come from text files,
JSONL (plain or gzip), Parquet (several files, several row groups, nulls skipped) or a mix, in
the order given. --field names the column or field (--jsonl-field too). Bad input fails
naming the file (and line or column). Reading streams: the peak memory reading a file of
hundreds of MB stays far below its size.

Run by ctest (label python): python prepare_data_test.py. Exits 77 (skipped) when pyarrow or
tokenizers is missing.
"""

import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as e:  # not the venv, or scripts/setup has not installed pyarrow
    print(f"skipped: {e}")
    sys.exit(77)

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
PREPARE = os.path.join(SCRIPTS, "prepare-data")
EOT = "<|endoftext|>"
TIMEOUT = 120  # seconds, for each run of the script


def make_documents(n, seed):
    """Documents of words, digits, punctuation, unicode and runs of whitespace and newlines."""
    rng = random.Random(seed)
    words = ["the", "quick", "brown", "fox", "jumps", "över", "naïve", "日本語", "données",
             "a", "I", "don't", "it's", "42", "3.14", "🙂", "--", "(x)", "end."]
    docs = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(5, 120)):
            parts.append(rng.choice(words))
            parts.append(rng.choice([" ", " ", " ", ", ", "\n", "\n\n", "  ", "\t"]))
        docs.append("".join(parts).strip(" ") + rng.choice(["", "\n"]))
    return docs


def train_tokenizer(docs, path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    tok.save(path)


def expected_ids(docs, tokenizer_path):
    tok = Tokenizer.from_file(tokenizer_path)
    eot = tok.token_to_id(EOT)
    ids = []
    for d in docs:
        ids.append(eot)
        ids.extend(tok.encode(d, add_special_tokens=False).ids)
    return ids


def read_ids(out):
    """The validation then the training files' ids, in name order (llm.c's format)."""
    names = sorted(n for n in os.listdir(out) if n.endswith(".bin"))
    ids = []
    for split in ("val", "train"):
        for n in (n for n in names if f"_{split}_" in n):
            raw = read_bytes(os.path.join(out, n))
            header = np.frombuffer(raw[:1024], dtype=np.int32)
            dtype = {20240520: np.uint16, 20240801: np.uint32}[int(header[0])]
            body = np.frombuffer(raw[1024:], dtype=dtype)
            assert len(body) == header[2], f"{n}: header says {header[2]}, holds {len(body)}"
            ids.extend(int(i) for i in body)
    return ids


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def write_parquet(path, rows, row_group_size, **columns):
    """A Parquet file like Hugging Face's: a text column among others, several row groups."""
    table = pa.table({"text": rows, **columns})
    pq.write_table(table, path, row_group_size=row_group_size)


def write_jsonl(path, rows, field="text"):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"id": i, field: r}) + "\n")


def prepare(inputs, out, *args, ok=True):
    p = subprocess.run([PREPARE, "--input", *inputs, "--out", out, *args],
                       capture_output=True, text=True, timeout=TIMEOUT)
    if ok and p.returncode != 0:
        raise AssertionError(f"prepare-data failed ({p.returncode}): {p.stderr}")
    return p


def summary(stdout, kind):
    """The summary line of one input kind: (files, documents, nulls, tokens)."""
    for line in stdout.splitlines():
        if line.startswith(f"prepare-data: {kind}: "):
            w = line.replace("(", " ").split()
            nulls = int(w[w.index("null") - 1]) if "null" in w else 0
            return int(w[2]), int(w[4]), nulls, int(w[w.index("tokens") - 1])
    raise AssertionError(f"no summary line for {kind} in:\n{stdout}")


class PrepareData(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="loco-prepare-data-")
        cls.docs = make_documents(90, seed=11)
        cls.tokenizer = os.path.join(cls.dir, "tokenizer.json")
        train_tokenizer(cls.docs, cls.tokenizer)
        cls.want = expected_ids(cls.docs, cls.tokenizer)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def path(self, *parts):
        p = os.path.join(self.dir, self._testMethodName, *parts)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def hf_folder(self, docs):
        """A dataset folder as the hub lays it out: data/train-0000K-of-00002.parquet (row
        groups of 7 rows, a null between documents, an int column) beside README.md."""
        half = len(docs) // 2
        rows = [docs[:half], docs[half:]]
        rows[0] = rows[0][:5] + [None] + rows[0][5:]
        for k, r in enumerate(rows):
            write_parquet(self.path("hf", "data", f"train-0000{k}-of-00002.parquet"), r, 7,
                          id=list(range(len(r))))
        with open(self.path("hf", "README.md"), "w") as f:
            f.write("---\nlicense: mit\n---\n# A dataset card, not a document\n")
        return os.path.dirname(os.path.dirname(self.path("hf", "data", "x")))

    def test_parquet_ids_are_tokenizers_ids_in_order(self):
        folder = self.hf_folder(self.docs)
        out = self.path("out")
        p = prepare([folder], out, "--tokenizer", self.tokenizer, "--val-fraction", "0")
        got = read_ids(out)
        self.assertEqual(got, self.want)
        self.assertEqual(summary(p.stdout, "parquet"), (2, len(self.docs), 1, len(got)))
        self.assertIn("left out 1 text files", p.stdout)  # the README.md
        print(f"parquet: {len(self.docs)} documents, {len(got)} ids as tokenizers gives them")

    def test_jsonl_field_and_its_old_name(self):
        src = self.path("docs.jsonl")
        rows = self.docs[:30] + [None] + self.docs[30:]
        write_jsonl(src, rows, field="content")
        with open(src, "a") as f:
            f.write("\n")  # a blank line is no document
        for flag in ("--field", "--jsonl-field"):
            out = self.path(flag)
            p = prepare([src], out, "--tokenizer", self.tokenizer, "--val-fraction", "0",
                        flag, "content")
            got = read_ids(out)
            self.assertEqual(got, self.want, flag)
            self.assertEqual(summary(p.stdout, "jsonl"), (1, len(self.docs), 1, len(got)))
        p = prepare([src], self.path("no-field"), "--tokenizer", self.tokenizer, ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"{src}:1: no field 'text' (--field); its fields: 'id', 'content'",
                      p.stderr)

    def test_parquet_field_names_the_column(self):
        src = self.path("named.parquet")
        pq.write_table(pa.table({"body": self.docs, "text": ["not this"] * len(self.docs)}),
                       src, row_group_size=11)
        out = self.path("out")
        prepare([src], out, "--tokenizer", self.tokenizer, "--val-fraction", "0",
                "--field", "body")
        self.assertEqual(read_ids(out), self.want)

    def test_the_same_token_files_from_text_jsonl_gzip_parquet_and_a_mix(self):
        d = self.docs
        for i, doc in enumerate(d):
            with open(self.path("txt", f"doc_{i:03d}.txt"), "w", encoding="utf-8") as f:
                f.write(doc)
        write_jsonl(self.path("all.jsonl"), d)
        write_jsonl(self.path("all.jsonl.gz"), d)
        shutil.copyfile(self.path("all.jsonl"), self.path("all.json"))  # named: JSON Lines
        write_parquet(self.path("all.parquet"), d, 13)
        write_jsonl(self.path("mix", "b.jsonl"), d[30:60])
        write_parquet(self.path("mix", "c.parquet"), d[60:], 9)
        mix = [self.path("txt", f"doc_{i:03d}.txt") for i in range(30)]
        mix += [self.path("mix", "b.jsonl"), self.path("mix", "c.parquet")]
        runs = {"text": [self.path("txt")], "jsonl": [self.path("all.jsonl")],
                "gzip": [self.path("all.jsonl.gz")], "json": [self.path("all.json")],
                "parquet": [self.path("all.parquet")],
                "mix": mix}
        outputs = {}
        for name, inputs in runs.items():
            out = self.path("out-" + name)
            p = prepare(inputs, out, "--tokenizer", self.tokenizer, "--val-fraction", "0.1",
                        "--shard-tokens", "1024")
            outputs[name] = {n: read_bytes(os.path.join(out, n)) for n in sorted(os.listdir(out))}
            if name == "mix":
                kinds = [summary(p.stdout, k) for k in ("text", "jsonl", "parquet")]
                self.assertEqual([k[:2] for k in kinds], [(30, 30), (1, 30), (1, len(d) - 60)])
                self.assertEqual(sum(k[3] for k in kinds), len(read_ids(out)))
        names = sorted(outputs["text"])
        self.assertGreater(len([n for n in names if "_train_" in n]), 1)
        self.assertTrue(any("_val_" in n for n in names))
        for name, files in outputs.items():
            self.assertEqual(sorted(files), names, name)
            for n in names:
                self.assertEqual(files[n], outputs["text"][n], f"{name}: {n}")
        print(f"{len(names)} files, byte for byte the same from {', '.join(outputs)}")

    def test_a_tokenizer_trained_on_parquet(self):
        folder = self.hf_folder(self.docs)
        out = self.path("out")
        p = prepare([folder], out, "--train-tokenizer", "--vocab", "350", "--val-fraction", "0")
        trained = os.path.join(out, "tokenizer.json")
        vocab = Tokenizer.from_file(trained).get_vocab_size(with_added_tokens=True)
        self.assertIn(f"vocabulary {vocab}", p.stdout)
        self.assertLessEqual(vocab, 350)
        self.assertEqual(read_ids(out), expected_ids(self.docs, trained))

    def refused(self, inputs, *args):
        p = prepare(inputs, self.path("out"), "--tokenizer", self.tokenizer, *args, ok=False)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        return p.stderr

    def test_bad_parquet_is_refused_naming_file_and_column(self):
        src = self.path("t.parquet")
        pq.write_table(pa.table({"text": ["a", "b"], "id": [1, 2], "raw": [b"x", b"y"]}), src)
        self.assertIn(f"{src}: no column 'body' (--field); its columns: 'text', 'id', 'raw'",
                      self.refused([src], "--field", "body"))
        self.assertIn(f"{src}: column 'id' is int64, not strings",
                      self.refused([src], "--field", "id"))
        self.assertIn(f"{src}: column 'raw' is binary, not strings",
                      self.refused([src], "--field", "raw"))
        big = self.path("big.parquet")
        write_parquet(big, ["small", "x" * (1 << 20) + "y", "small"], 10)
        self.assertIn(f"{big}: row 1: a 'text' value over 1048576 bytes",
                      self.refused([big], "--max-document-mib", "1"))
        junk = self.path("junk.parquet")
        with open(junk, "wb") as f:
            f.write(b"PAR1 not really")
        self.assertIn(f"{junk}: cannot read as Parquet", self.refused([junk]))
        cut = self.path("cut.parquet")
        whole = read_bytes(src)
        with open(cut, "wb") as f:
            f.write(whole[: len(whole) // 2])
        self.assertIn(f"{cut}: cannot read as Parquet", self.refused([cut]))

    def test_a_text_file_over_the_document_bound_is_refused_before_it_is_read(self):
        # A .txt is one document: over --max-document-mib it is refused naming the file and the
        # bound (before, it was read whole whatever its size: 1.5 GB took 3.67 GB of memory).
        big = self.path("big.txt")
        with open(big, "w") as f:
            f.write("word " * ((3 << 20) // 10))  # 1.5 MiB
        self.assertIn(f"{big}: {os.path.getsize(big)} bytes, a document over 1048576 bytes "
                      "(--max-document-mib)", self.refused([big], "--max-document-mib", "1"))
        # Under the bound it is read as before.
        p = prepare([big], self.path("out"), "--tokenizer", self.tokenizer,
                    "--max-document-mib", "2", "--val-fraction", "0")
        self.assertEqual(summary(p.stdout, "text")[1], 1)

    def test_bad_jsonl_is_refused_naming_file_and_line(self):
        def jsonl(name, text):
            path = self.path(name)
            with open(path, "w") as f:
                f.write(text)
            return path

        ok = '{"text": "fine"}\n'
        cases = [
            ("a.jsonl", ok + "{not json\n", ":2: not JSON"),
            ("b.jsonl", ok + '["text"]\n', ":2: not a JSON object"),
            ("c.jsonl", ok + ok + '{"txt": "x", "n": 1}\n',
             ":3: no field 'text' (--field); its fields: 'txt', 'n'"),
            ("d.jsonl", '{"text": 5}\n', ":1: field 'text' is a number, not a string"),
            ("e.jsonl", '{"text": ["a"]}\n', ":1: field 'text' is an array, not a string"),
            ("f.jsonl", '{"text": "\\ud800"}\n', ":1: field 'text' holds a lone surrogate"),
            ("g.jsonl", ok + '{"text": "' + "x" * (1 << 20) + '"}\n' + ok,
             ":2: a line over 1048576 bytes"),
        ]
        for name, text, error in cases:
            path = jsonl(name, text)
            self.assertIn(path + error, self.refused([path], "--max-document-mib", "1"), name)
        latin = self.path("h.jsonl")
        with open(latin, "wb") as f:
            f.write(ok.encode() + '{"text": "caf\xe9"}\n'.encode("latin-1"))
        self.assertIn(f"{latin}:2: not UTF-8", self.refused([latin]))
        gz = jsonl("i.jsonl.gz", "not gzip")
        self.assertIn(f"{gz}: cannot read", self.refused([gz]))
        # The same errors while training a tokenizer (the first pass over the inputs).
        p = prepare([self.path("a.jsonl")], self.path("train"), "--train-tokenizer",
                    "--vocab", "300", ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(self.path("a.jsonl") + ":2: not JSON", p.stderr)


# Reading a file of a few hundred MB against reading a small one of the same kind, each in a
# child process: streaming adds a bounded amount to the peak resident set. The peak is the
# child's VmHWM (its own address space's); ru_maxrss would carry the parent's over the exec.
PEAK = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) >> 10"
READER = f"""
import sys
sys.path.insert(0, sys.argv[1])
import prepare_data
n = sum(len(t) for _, t in prepare_data.documents(sys.argv[3:], sys.argv[2], 64 << 20))
print(n, {PEAK})
"""
SCRIPT = f"""
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("peak", {PEAK}, file=sys.stderr)
"""
BIG_MIB = 300
LIMIT_MIB = BIG_MIB // 2


class Streaming(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="loco-prepare-stream-")
        rng = random.Random(3)
        base = "".join(rng.choice("abcdefghij klmnop\n") for _ in range(1 << 20))
        cls.doc_chars = 20000
        cls.rows = (BIG_MIB << 20) // cls.doc_chars
        cls.big_parquet = os.path.join(cls.dir, "big.parquet")
        cls.big_jsonl = os.path.join(cls.dir, "big.jsonl")
        schema = pa.schema([("title", pa.string()), ("text", pa.string())])
        with pq.ParquetWriter(cls.big_parquet, schema, compression="none",
                              use_dictionary=False) as w, open(cls.big_jsonl, "w") as j:
            for start in range(0, cls.rows, 1000):  # row groups of 1000 rows (20 MB)
                docs = [cls.doc(base, i) for i in range(start, min(start + 1000, cls.rows))]
                titles = [f"title {i}" for i in range(start, start + len(docs))]
                w.write_table(pa.table({"title": titles, "text": docs}, schema=schema))
                j.writelines(json.dumps({"text": d}) + "\n" for d in docs)
        cls.small_parquet = os.path.join(cls.dir, "small.parquet")
        cls.small_jsonl = os.path.join(cls.dir, "small.jsonl")
        pq.write_table(pa.table({"title": ["t"] * 10, "text": ["x" * 100] * 10}),
                       cls.small_parquet)
        write_jsonl(cls.small_jsonl, ["x" * 100] * 10)

    @classmethod
    def doc(cls, base, i):
        at = (i * 7919) % (len(base) - cls.doc_chars)
        return base[at : at + cls.doc_chars]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def read(self, path, field="text"):
        p = subprocess.run([sys.executable, "-c", READER, SCRIPTS, field, path],
                           capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(p.returncode, 0, p.stderr)
        chars, peak = map(int, p.stdout.split())
        return chars, peak

    def test_the_readers_stream(self):
        for kind, big, small in (("parquet", self.big_parquet, self.small_parquet),
                                 ("jsonl", self.big_jsonl, self.small_jsonl)):
            size = os.path.getsize(big) >> 20
            chars, peak = self.read(big)
            _, base = self.read(small)
            print(f"{kind}: read {size} MiB, {chars} characters: peak {peak} MiB, "
                  f"{peak - base} MiB over a small file's {base} MiB")
            self.assertEqual(chars, self.rows * self.doc_chars)
            self.assertLess(peak - base, LIMIT_MIB, kind)

    def run_script(self, path, *args):
        """scripts/prepare-data's main in a child; its output and its peak resident set."""
        out = os.path.join(self.dir, "out-" + os.path.basename(path))
        script = os.path.join(SCRIPTS, "prepare_data.py")
        p = subprocess.run([sys.executable, "-c", SCRIPT, script, "--input", path, "--out", out,
                            *args],
                           capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout, int(p.stderr.split("peak")[-1])

    def test_the_script_reads_only_the_field_column(self):
        # --field title: the 300 MB text column beside it is never read.
        args = ["--field", "title", "--train-tokenizer", "--vocab", "300", "--val-fraction", "0"]
        stdout, peak = self.run_script(self.big_parquet, *args)
        _, base = self.run_script(self.small_parquet, *args)
        self.assertEqual(summary(stdout, "parquet")[1], self.rows)
        print(f"script on {self.rows} titles beside {BIG_MIB} MB of text: peak {peak} MiB, "
              f"on a small file {base} MiB")
        self.assertLess(peak - base, LIMIT_MIB)


if __name__ == "__main__":
    unittest.main(verbosity=2)
