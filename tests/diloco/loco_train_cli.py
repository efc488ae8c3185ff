"""What the Python tests of loco-train share: running it, a small job file, a corpus of words,
logits from loco and from transformers, a run's metrics. Torch-free; hf_logits imports torch
when called."""

import json
import os
import random
import subprocess
import tempfile

LOCO_TRAIN = None  # the binary: set by each test's main (sys.argv[1])
# The tokens whose logits the tests compare: ids of the byte tokenizer, the ends of its range
# among them.
TOKENS = [1, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 10, 255, 0, 7]


def run(*args, ok=True):
    """loco-train with `args`; with `ok` a non-zero exit fails the test with its stderr."""
    p = subprocess.run([LOCO_TRAIN, *args], capture_output=True, text=True)
    if ok and p.returncode != 0:
        raise AssertionError(f"loco-train {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def write_corpus(data):
    """data/corpus/a.txt: 30,000 words of a small vocabulary, the same every time."""
    os.makedirs(os.path.join(data, "corpus"))
    words = ("and the lord said unto moses in the beginning god created heaven and earth "
             "and the earth was without form and void").split()
    rng = random.Random(3)
    with open(os.path.join(data, "corpus", "a.txt"), "w") as f:
        f.write(" ".join(rng.choice(words) for _ in range(30000)))


def write_job(path, data, model, name="test"):
    """A job of 2 rounds of 3 steps on `data` whose model section holds the fields `model`."""
    lines = [f"  {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in model.items()]
    text = "\n".join([
        f"name: {name}", "seed: 5", "threads: 1", "model:", *lines,
        "data:", f"  dir: {data}", "  shards: 4", "  val_fraction: 0.05",
        "inner:", "  steps: 3", "  batch_size: 4", "  warmup: 2", "  lr: 0.01",
        "rounds: 2", "eval:", "  every: 3", "  batches: 2", ""])
    with open(path, "w") as f:
        f.write(text)
    return path


def loco_logits(*args, tokens=TOKENS):
    """`loco-train logits` of `tokens` (a checkpoint, or --job ...): a [T, vocab] array."""
    import numpy as np
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "logits.json")
        run("logits", *args, "--tokens", ",".join(map(str, tokens)), "--out", out)
        with open(out) as f:
            j = json.load(f)
    return np.array(j["logits"], dtype=np.float32).reshape(j["shape"])


def hf_logits(model, tokens=TOKENS):
    """A transformers model's logits of `tokens`, [T, vocab], fp32."""
    import torch
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().numpy()


def metrics(run_dir):
    """The run's metrics.jsonl, a dict per round."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def theta_hashes(run_dir):
    return [m["theta_hash"] for m in metrics(run_dir)]
