"""The Hugging Face decoder families loco reads, trains and writes back, against transformers.

For Llama 2 (llama), Llama 3 (llama with rope_scaling llama3, GQA, rope_theta 500000),
Mistral (mistral, a head_dim that is not hidden / heads; sliding_window null, and one shorter
than the job's context), Qwen2 tied and untied (qwen2: biases on q, k and v) and SmolLM2 (llama,
tied, saved as bf16 shards with model.safetensors.index.json): a tiny random model made with
transformers' config classes and saved with save_pretrained is the whole model of a job file
(`model: {hf: DIR, context: 16}`), and
  - loco's logits on fixed tokens equal transformers' within 1e-4;
  - the job trains 2 rounds with 2 workers (loco-train train --simulate 2) and θ moves;
  - `loco-train export --format hf` writes a folder of the same model_type that
    AutoModelForCausalLM loads as the same class, with the fields read (rope_scaling,
    sliding_window, head_dim, max_position_embeddings, tie_word_embeddings), and its logits
    equal loco's on the checkpoint within 1e-4.
Folders loco does not compute as transformers does are refused naming the field and value
(model_type gemma2, rope_scaling yarn and dynamic, hidden_act gelu, Qwen2's use_sliding_window),
and a job file field that disagrees with the folder is refused naming both.

Run by ctest (label python): python hf_families_test.py LOCO_TRAIN. Exits 77 (skipped) when
torch or transformers is missing.
"""

import glob
import json
import os
import shutil
import sys
import tempfile
import unittest

try:
    import numpy as np
    import torch
    from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)
except ImportError as e:  # not the venv
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loco_train_cli as cli  # noqa: E402
from loco_train_cli import hf_logits, loco_logits, run, theta_hashes  # noqa: E402

TOLERANCE = 1e-4
CONTEXT = 16
SHAPE = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4)

# name: (config class, model class, fields beyond SHAPE, saved in shards)
CASES = {
    "llama2": (LlamaConfig, LlamaForCausalLM,
               dict(num_key_value_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5,
                    tie_word_embeddings=False), False),
    "llama3": (LlamaConfig, LlamaForCausalLM,
               dict(num_key_value_heads=2, max_position_embeddings=1024, rope_theta=500000.0,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 256},
                    tie_word_embeddings=False), False),
    "mistral": (MistralConfig, MistralForCausalLM,
                dict(num_key_value_heads=2, head_dim=16, sliding_window=None,
                     max_position_embeddings=128, tie_word_embeddings=False), False),
    "mistral-window": (MistralConfig, MistralForCausalLM,
                       dict(num_key_value_heads=2, sliding_window=5, max_position_embeddings=128,
                            tie_word_embeddings=False), False),
    "qwen2-tied": (Qwen2Config, Qwen2ForCausalLM,
                   dict(num_key_value_heads=2, rope_theta=1000000.0, use_sliding_window=False,
                        sliding_window=4096, max_position_embeddings=256,
                        tie_word_embeddings=True), False),
    "qwen2-untied": (Qwen2Config, Qwen2ForCausalLM,
                     dict(num_key_value_heads=1, rope_theta=1000000.0,
                          max_position_embeddings=256, tie_word_embeddings=False), False),
    "smollm2": (LlamaConfig, LlamaForCausalLM,
                dict(num_key_value_heads=2, hidden_size=48, num_attention_heads=6,
                     rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                     tie_word_embeddings=True), True),
}

# Fields of config.json an export must keep as read.
KEPT = ["model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
        "rms_norm_eps", "tie_word_embeddings", "vocab_size"]


def job_file(path, data, hf, model_fields=None):
    fields = {"hf": hf, "context": CONTEXT, **(model_fields or {})}
    return cli.write_job(path, data, fields, name="family")


def max_diff(a, b):
    return float(np.abs(a - b).max())


def random_model(config_class, model_class, fields):
    """A model of the family with every parameter random (transformers' init leaves biases 0
    and norms 1, which would let a missing bias or norm go unseen)."""
    config = config_class(**{**SHAPE, **fields})
    model = model_class(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    return model


class HfFamilies(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.tmp = tempfile.mkdtemp(prefix="loco-hf-families-")
        cls.data = os.path.join(cls.tmp, "data")
        cli.write_corpus(cls.data)
        # A Llama 2 folder that the refusals edit.
        config_class, model_class, fields, _ = CASES["llama2"]
        cls.base = os.path.join(cls.tmp, "base")
        random_model(config_class, model_class, fields).save_pretrained(cls.base)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def saved(self, name):
        """The case's random model, saved: (model, its folder)."""
        config_class, model_class, fields, sharded = CASES[name]
        model = random_model(config_class, model_class, fields)
        hf = os.path.join(self.tmp, name, "hf")
        if not sharded:
            model.save_pretrained(hf)
            return model, hf
        # Shards of bf16 tensors, as pretrained checkpoints are published; the reference is
        # transformers' model of those bf16 values, computed in fp32 as loco computes.
        model.to(torch.bfloat16).save_pretrained(hf, max_shard_size="10KB")
        self.assertTrue(os.path.exists(os.path.join(hf, "model.safetensors.index.json")))
        self.assertFalse(os.path.exists(os.path.join(hf, "model.safetensors")))
        self.assertGreater(len(glob.glob(os.path.join(hf, "model-*-of-*.safetensors"))), 2)
        with open(os.path.join(hf, "config.json")) as f:
            self.assertEqual(json.load(f)["dtype"], "bfloat16")
        return AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32), hf

    def check_family(self, name):
        config_class, model_class, fields, _ = CASES[name]
        model, hf = self.saved(name)
        folder = os.path.dirname(hf)
        job = job_file(os.path.join(folder, "job.yaml"), self.data, hf)
        theirs = hf_logits(model)
        diff = max_diff(loco_logits("--job", job), theirs)
        print(f"{name}: transformers' model in loco: max |logit difference| {diff:.3g}",
              file=sys.stderr)
        self.assertLessEqual(diff, TOLERANCE)

        out = os.path.join(folder, "run")
        run("train", "--simulate", "2", job, "--out", out)
        hashes = theta_hashes(out)
        self.assertEqual(len(hashes), 3)  # the start and 2 rounds
        self.assertNotEqual(hashes[0], hashes[-1])
        ckpt = os.path.join(out, "checkpoints", "latest.pt")

        exported = os.path.join(folder, "export")
        run("export", ckpt, "--format", "hf", "--out", exported)
        with open(os.path.join(hf, "config.json")) as f:
            original = json.load(f)
        with open(os.path.join(exported, "config.json")) as f:
            written = json.load(f)
        self.assertEqual(written["architectures"], [model_class.__name__])
        for key in KEPT:
            if key in original:
                self.assertEqual(written[key], original[key], key)
        again = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
        self.assertEqual(type(again), model_class)
        ours = loco_logits("--checkpoint", ckpt)
        diff = max_diff(ours, hf_logits(again))
        print(f"{name}: loco's export in transformers: max |logit difference| {diff:.3g} over "
              f"{ours.shape}", file=sys.stderr)
        self.assertLessEqual(diff, TOLERANCE)
        # Trained: not the logits it started from.
        self.assertGreater(max_diff(ours, theirs), 1e-3)
        return model, original, written

    def test_llama2(self):
        self.check_family("llama2")

    def test_llama3_rope_scaling(self):
        model, original, written = self.check_family("llama3")
        self.assertEqual(written["rope_parameters"]["rope_type"], "llama3")
        for key in ["factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings"]:
            self.assertEqual(written["rope_scaling"][key], original["rope_parameters"][key], key)
        self.assertEqual(written["rope_theta"], 500000.0)
        # The scaling matters at these sizes: without it transformers' logits are others.
        plain = random_model(LlamaConfig, LlamaForCausalLM,
                             {k: v for k, v in CASES["llama3"][2].items() if k != "rope_scaling"})
        plain.load_state_dict(model.state_dict())
        self.assertGreater(max_diff(hf_logits(plain), hf_logits(model)), 1e-3)

    def test_mistral(self):
        _, _, written = self.check_family("mistral")
        self.assertIsNone(written["sliding_window"])
        self.assertEqual(written["head_dim"], 16)

    def test_mistral_sliding_window_shorter_than_the_context(self):
        model, _, written = self.check_family("mistral-window")
        self.assertEqual(written["sliding_window"], 5)
        # The window matters: without it transformers' logits are others.
        wide = random_model(MistralConfig, MistralForCausalLM,
                            {**CASES["mistral-window"][2], "sliding_window": None})
        wide.load_state_dict(model.state_dict())
        self.assertGreater(max_diff(hf_logits(wide), hf_logits(model)), 1e-3)

    def test_qwen2_tied(self):
        _, _, written = self.check_family("qwen2-tied")
        self.assertTrue(written["tie_word_embeddings"])
        self.assertFalse(written["use_sliding_window"])

    def test_qwen2_untied(self):
        self.check_family("qwen2-untied")

    def test_smollm2_sharded(self):
        self.check_family("smollm2")

    def refused(self, name, edit, expected, model_fields=None):
        """The Llama 2 folder with its config.json edited: loco refuses it, saying
        `expected`."""
        bad = os.path.join(self.tmp, "refused-" + name)
        shutil.copytree(self.base, bad)
        with open(os.path.join(bad, "config.json")) as f:
            config = json.load(f)
        edit(config)
        with open(os.path.join(bad, "config.json"), "w") as f:
            json.dump(config, f)
        job = job_file(os.path.join(self.tmp, f"refused-{name}.yaml"), self.data, bad,
                       model_fields)
        out = os.path.join(self.tmp, f"refused-{name}.json")
        p = run("logits", "--job", job, "--tokens", "1,2", "--out", out, ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(expected, p.stderr)
        self.assertFalse(os.path.exists(out))

    def test_what_loco_does_not_compute_is_refused_naming_the_field(self):
        self.refused("gemma2", lambda c: c.update(model_type="gemma2"), "model_type: gemma2")
        self.refused("yarn", lambda c: c.update(rope_scaling={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
            "rope_scaling.rope_type: yarn")
        self.refused("dynamic", lambda c: c.update(rope_scaling={"type": "dynamic", "factor": 2.0}),
                     "rope_scaling.type: dynamic")
        self.refused("gelu", lambda c: c.update(hidden_act="gelu"), "hidden_act: gelu")
        self.refused("attention-bias", lambda c: c.update(attention_bias=True),
                     "attention_bias: true")

        def qwen_window(c):
            c.update(model_type="qwen2", use_sliding_window=True, sliding_window=8)
        self.refused("qwen2-window", qwen_window, "use_sliding_window: true")
        # A field of the job file that disagrees with the folder names both.
        self.refused("layers", lambda c: None,
                     "num_hidden_layers is 2, but the job's model.layers is 3", {"layers": 3})
        self.refused("tied", lambda c: None,
                     "tie_word_embeddings is false, but the job's model.tied_embeddings is true",
                     {"tied_embeddings": True})
        self.refused("context", lambda c: c.update(max_position_embeddings=8),
                     "max_position_embeddings is 8, but the job's model.context is 16")


if __name__ == "__main__":
    cli.LOCO_TRAIN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
