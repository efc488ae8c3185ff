"""Test tokenizers of the families loco's C++ encoder reads, trained on a corpus with Hugging
Face's `tokenizers` (no download), saved as tokenizer.json with the structure of the real
files (field by field, as transformers' convert_slow_tokenizer writes them):

  llama3.json             byte-level BPE, Llama 3's Split regex then ByteLevel(use_regex=False),
                          ignore_merges, special tokens after the vocabulary, a Sequence
                          post-processor with the <|begin_of_text|> template
  llama2.json             SentencePiece-style (Llama 2, Mistral v0.1): normalizer
                          Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer, BPE with
                          <unk> <s> </s> then <0x00>..<0xFF>, byte_fallback, fuse_unk; decoder
                          Sequence[Replace, ByteFallback, Fuse, Strip]; merges of runs of "▁"
  llama2-normalized.json  the same with added tokens matched after normalizing (normalized: true)
  llama2-unk.json         the same without byte fallback: unknown characters are one fused <unk>
  metaspace.json          newer conversions: no normalizer, Metaspace(prepend_scheme first,
                          split false)

usage: make_test_tokenizers.py CORPUS OUTDIR
"""
import json
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Vocabulary entries no merge makes: with ignore_merges a word that is one of them is its id.
UNMERGED = ["Ġqqqq", "Ġzyzzyva"]


def lines(corpus):
    with open(corpus, encoding="utf-8") as f:
        return f.read().splitlines(keepends=True)


def save(j, path):
    Tokenizer.from_str(json.dumps(j)).save(path)  # through `tokenizers`: it must accept it


def llama3(text, out):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(text, trainer)
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True
    for t in UNMERGED:
        j["model"]["vocab"][t] = len(j["model"]["vocab"])
    tok = Tokenizer.from_str(json.dumps(j))
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    specials += [f"<|reserved_special_token_{i}|>" for i in range(4)]
    tok.add_special_tokens(specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    tok.save(out + "/llama3.json")


def spm_base(text):
    """A SentencePiece-style BPE: words begin with ▁, ids 0-2 <unk> <s> </s>, 3-258 bytes."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    tok.train_from_iterator(text, trainer)
    j = json.loads(tok.to_str())
    old = j["model"]["vocab"]
    vocab = {t: i for t, i in old.items() if i < 3}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    vocab.update({t: i + 256 for t, i in sorted(old.items(), key=lambda kv: kv[1]) if i >= 3})
    merges = j["model"]["merges"]
    for run in ["▁▁", "▁▁▁▁", "▁▁▁▁▁▁▁▁"]:  # Llama's vocabulary merges runs of spaces
        half = run[: len(run) // 2]
        merges.append([half, half])
        vocab[run] = len(vocab)
    j["model"].update(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                      byte_fallback=True, dropout=None, ignore_merges=False)
    j["added_tokens"] = [
        {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, c in enumerate(["<unk>", "<s>", "</s>"])
    ]
    j["decoder"] = json.loads(decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(content=" ", left=1, right=0)]).__getstate__())
    j["post_processor"] = json.loads(processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]).__getstate__())
    return j


def spm_variants(text, out):
    base = spm_base(text)
    legacy = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    j = dict(base, normalizer=legacy, pre_tokenizer=None)
    save(j, out + "/llama2.json")
    normalized = [dict(t, normalized=True) for t in base["added_tokens"]]
    save(dict(j, added_tokens=normalized), out + "/llama2-normalized.json")
    save(dict(j, model=dict(base["model"], byte_fallback=False)), out + "/llama2-unk.json")
    metaspace = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                 "split": False}
    save(dict(base, normalizer=None, pre_tokenizer=metaspace), out + "/metaspace.json")


if __name__ == "__main__":
    text = lines(sys.argv[1])
    llama3(text, sys.argv[2])
    spm_variants(text, sys.argv[2])
