"""A model of the user's own through loco-train, as a user runs it (in the venv, on the CPU).

A small GRU language model (embedding, GRU, linear head, cross-entropy in
forward(tokens, targets)) is scripted and saved with torch.jit.script(...).save(path)
(torchscript_models.py), and a job with `model: {torchscript: FILE}`:
  - trains in a 2-worker job (loco-train train --simulate 2): the validation loss falls;
  - resumed from a checkpoint, holds the θ hashes of the uninterrupted run;
  - is refused, naming the file and the reason, for a module without forward(tokens, targets),
    one returning a non-scalar, a missing file, and a resume with another file; Hugging Face
    export, generate and logits refuse a TorchScript checkpoint.

Run by ctest (label python): python torchscript_test.py LOCO_TRAIN. Exits 77 (skipped) when
torch is missing.
"""

import os
import shutil
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401 (the models are scripted with it)
except ImportError as e:  # not the venv
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loco_train_cli as cli  # noqa: E402
from loco_train_cli import metrics, run  # noqa: E402
import torchscript_models  # noqa: E402



class TorchScriptModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="loco-torchscript-")
        cls.data = os.path.join(cls.tmp, "data")
        cli.write_corpus(cls.data)
        cls.models = os.path.join(cls.tmp, "models")
        torchscript_models.write_all(cls.models, vocab=256, width=32, context=32)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def job(self, name, module, rounds=4, extra=""):
        """A job file of `module` (a file in the models folder), 4 rounds of H = 5."""
        folder = os.path.join(self.tmp, name)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "job.yaml")
        with open(path, "w") as f:
            f.write("\n".join([
                "name: ts", "seed: 5", "threads: 1",
                f"model: {{torchscript: {os.path.join(self.models, module)}, context: 32}}",
                f"data: {{dir: {self.data}, shards: 4, val_fraction: 0.05}}",
                "inner: {steps: 5, batch_size: 4, warmup: 2, lr: 0.01" + extra + "}",
                f"rounds: {rounds}", "eval: {every: 5, batches: 2}", ""]))
        return path, folder

    def test_a_gru_trains_in_a_two_worker_job(self):
        job, folder = self.job("train", "gru.pt")
        out = os.path.join(folder, "run")
        p = run("train", "--simulate", "2", job, "--out", out)
        self.assertIn("model of 22976 parameters, diloco with K=2", p.stderr)
        m = metrics(out)
        losses = [line["val_loss"] for line in m]
        print(f"gru, 2 workers: val loss by round {[round(v, 4) for v in losses]}",
              file=sys.stderr)
        self.assertEqual([line["round"] for line in m], [0, 1, 2, 3, 4])
        self.assertLess(losses[-1], losses[0] - 1.0)

    def test_resumed_from_a_checkpoint_it_holds_the_uninterrupted_runs_theta(self):
        # After warmup the rate is constant (min_lr_ratio 1), so a run of 2 rounds is the first
        # half of one of 4, and --resume --rounds 4 its second half.
        job, folder = self.job("resume", "gru.pt", extra=", min_lr_ratio: 1.0")
        straight, half = os.path.join(folder, "straight"), os.path.join(folder, "half")
        run("train", "--simulate", "2", job, "--out", straight)
        run("train", "--simulate", "2", job, "--out", half, "--rounds", "2")
        ckpt = os.path.join(half, "checkpoints", "latest.pt")
        run("train", "--simulate", "2", job, "--out", half, "--rounds", "4", "--resume", ckpt)
        expected = [line["theta_hash"] for line in metrics(straight)]
        got = [line["theta_hash"] for line in metrics(half)]
        print(f"θ hashes, uninterrupted {expected}, resumed at round 2 {got}", file=sys.stderr)
        self.assertEqual(got, expected)
        # The same path holding another file: the checkpoint's hash refuses it.
        other, _ = self.job("resume-other", "gru_other.pt")
        p = run("train", "--simulate", "2", other, "--out", half, "--resume", ckpt, ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("is of another model: model.torchscript_hash (", p.stderr)

    def test_what_loco_cannot_train_is_refused_naming_the_file(self):
        cases = {
            "forward_one_arg.pt": "ForwardOneArg self, "
                                  "Tensor tokens) -> Tensor`; loco calls forward(tokens, targets)",
            "per_token.pt": "forward returned a Float tensor of shape [32]; loco trains on the "
                            "mean loss, a scalar",
            "missing.pt": "no such file",
        }
        for module, expected in cases.items():
            with self.subTest(module):
                job, folder = self.job("refused-" + module, module)
                p = run("train", "--simulate", "2", job, "--out", os.path.join(folder, "run"),
                        ok=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(f"model.torchscript {os.path.join(self.models, module)}: ",
                              p.stderr)
                self.assertIn(expected, p.stderr)

    def test_export_generate_and_logits_refuse_a_torchscript_checkpoint(self):
        job, folder = self.job("export", "gru.pt", rounds=1)
        out = os.path.join(folder, "run")
        run("train", "--simulate", "2", job, "--out", out)
        ckpt = os.path.join(out, "checkpoints", "latest.pt")
        for args in (["export", ckpt, "--format", "hf", "--out", os.path.join(folder, "hf")],
                     ["generate", "--checkpoint", ckpt, "--prompt", "and"],
                     ["logits", "--checkpoint", ckpt, "--tokens", "1,2",
                      "--out", os.path.join(folder, "l.json")]):
            with self.subTest(args[0]):
                p = run(*args, ok=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("the model is a TorchScript module (model.torchscript ", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(folder, "hf")))


if __name__ == "__main__":
    cli.LOCO_TRAIN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
