"""loco's models against Hugging Face transformers (on the CPU, in the venv).

For gpt2 and llama (tied and untied, with and without grouped-query attention): a tiny job
trains a few steps (loco-train train --simulate 2), `loco-train export --format hf` writes its
folder, transformers loads it as GPT2LMHeadModel / LlamaForCausalLM, and its logits on fixed
tokens equal loco's (`loco-train logits`) within 1e-4. A job started from that folder
(--init hf:DIR) starts from the checkpoint's θ (the same hash), and a model that transformers
made and saved itself reads back into loco with the same logits.

Run by ctest (label python): python hf_export_test.py LOCO_TRAIN. Exits 77 (skipped) when
torch or transformers is missing.
"""

import json
import os
import shutil
import sys
import tempfile
import unittest

try:
    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
except ImportError as e:  # not the venv
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loco_train_cli as cli  # noqa: E402
from loco_train_cli import hf_logits, loco_logits, run, theta_hashes  # noqa: E402

TOLERANCE = 1e-4

CASES = {
    "gpt2-tied": {"arch": "gpt2", "tied_embeddings": True},
    "gpt2-untied": {"arch": "gpt2", "tied_embeddings": False, "mlp_hidden": 48},
    "llama-gqa-untied": {"arch": "llama", "tied_embeddings": False, "kv_heads": 2,
                         "mlp_hidden": 48},
    "llama-tied": {"arch": "llama", "tied_embeddings": True, "rope_theta": 500.0},
}


def job_file(folder, data, model):
    fields = {"layers": 2, "width": 32, "heads": 4, "context": 16, **model}
    return cli.write_job(os.path.join(folder, "job.yaml"), data, fields, name="hf")


class HfExport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.tmp = tempfile.mkdtemp(prefix="loco-hf-export-")
        cls.data = os.path.join(cls.tmp, "data")
        cli.write_corpus(cls.data)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def trained(self, name):
        """A case's job trained 2 rounds: (job file, checkpoint, run folder)."""
        folder = os.path.join(self.tmp, name)
        os.makedirs(folder, exist_ok=True)
        job = job_file(folder, self.data, CASES[name])
        out = os.path.join(folder, "run")
        run("train", "--simulate", "2", job, "--out", out)
        return job, os.path.join(out, "checkpoints", "latest.pt"), out

    def test_exported_models_give_locos_logits_in_transformers(self):
        for name, model in CASES.items():
            with self.subTest(name):
                job, ckpt, out = self.trained(name)
                hf = os.path.join(self.tmp, name, "hf")
                run("export", ckpt, "--format", "hf", "--out", hf)
                with open(os.path.join(hf, "config.json")) as f:
                    config = json.load(f)
                cls = GPT2LMHeadModel if model["arch"] == "gpt2" else LlamaForCausalLM
                self.assertEqual(config["architectures"], [cls.__name__])
                hf_model = cls.from_pretrained(hf, dtype=torch.float32)
                self.assertEqual(type(hf_model), cls)
                self.assertEqual(hf_model.config.tie_word_embeddings, model["tied_embeddings"])
                ours = loco_logits("--checkpoint", ckpt)
                theirs = hf_logits(hf_model)
                self.assertEqual(ours.shape, theirs.shape)
                diff = float(np.abs(ours - theirs).max())
                print(f"{name}: max |logit difference| {diff:.3g} over {ours.shape}",
                      file=sys.stderr)
                self.assertLessEqual(diff, TOLERANCE)
                # The logits are not trivially equal (e.g. all zero): the model has learned.
                self.assertGreater(float(np.abs(ours).max()), 0.1)

                # A job started from the folder starts from the checkpoint's θ, bit for bit.
                again = os.path.join(self.tmp, name, "from-hf")
                run("train", "--simulate", "1", job, "--rounds", "1", "--init", "hf:" + hf,
                    "--out", again)
                self.assertEqual(theta_hashes(again)[0], theta_hashes(out)[-1])

                # Written once; a second export into the folder needs --force.
                p = run("export", ckpt, "--format", "hf", "--out", hf, ok=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("exists and is not empty (--force", p.stderr)
                run("export", ckpt, "--format", "hf", "--out", hf, "--force", "--dtype", "bf16")
                with open(os.path.join(hf, "config.json")) as f:
                    self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")
                half = hf_logits(cls.from_pretrained(hf, dtype=torch.float32))
                # bf16 weights: close to the fp32 logits, not equal.
                self.assertGreater(float(np.abs(half - theirs).max()), 0.0)
                self.assertLess(float(np.abs(half - theirs).max()), 0.1)

    def test_a_model_transformers_saved_starts_a_loco_job(self):
        cases = {
            "gpt2": (GPT2LMHeadModel, GPT2Config(
                vocab_size=256, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                activation_function="gelu_new", tie_word_embeddings=True),
                {"arch": "gpt2", "tied_embeddings": True}),
            "llama": (LlamaForCausalLM, LlamaConfig(
                vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                rms_norm_eps=1e-5, tie_word_embeddings=False),
                {"arch": "llama", "tied_embeddings": False, "kv_heads": 2, "mlp_hidden": 48}),
        }
        for name, (cls, config, model) in cases.items():
            with self.subTest(name):
                folder = os.path.join(self.tmp, "saved-" + name)
                os.makedirs(folder)
                hf_model = cls(config)
                hf_model.save_pretrained(os.path.join(folder, "hf"))
                job = job_file(folder, self.data, model)
                ours = loco_logits("--job", job, "--init", "hf:" + os.path.join(folder, "hf"))
                diff = float(np.abs(ours - hf_logits(hf_model)).max())
                print(f"transformers' {name}: max |logit difference| {diff:.3g}", file=sys.stderr)
                self.assertLessEqual(diff, TOLERANCE)

        # A folder of another shape is refused, naming the field.
        bad = job_file(os.path.join(self.tmp, "saved-llama"), self.data,
                       {"arch": "llama", "tied_embeddings": False, "kv_heads": 4,
                        "mlp_hidden": 48})
        out = os.path.join(self.tmp, "bad.json")
        p = run("logits", "--job", bad, "--init",
                "hf:" + os.path.join(self.tmp, "saved-llama", "hf"), "--tokens", "1,2",
                "--out", out, ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("num_key_value_heads is 2, but the job's model.kv_heads is 4", p.stderr)


if __name__ == "__main__":
    cli.LOCO_TRAIN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
