"""Small TorchScript models for loco's `model: {torchscript: FILE}` tests, scripted and saved
as a user would (torch.jit.script(model).save(path)).

    python torchscript_models.py OUT_DIR [--vocab 256] [--width 32]

writes into OUT_DIR:
  gru.pt              a GRU language model (embedding, GRU, linear head, cross-entropy in
                      forward(tokens, targets)): what the tests train
  gru_other.pt        the same architecture from another seed (another file, another hash)
  mixer.pt            an MLP-mixer language model with a tied head and a constant causal mask
                      buffer (a tied parameter, a buffer that stays constant)
  forward_one_arg.pt  forward(tokens) only: refused
  per_token.pt        forward returns each token's loss, not their mean: refused
  dropout.pt          dropout in training: refused (it draws random numbers)
  batchnorm.pt        BatchNorm: refused (forward changes its running statistics)
  float64.pt          float64 parameters: refused
  vocab64.pt          an embedding of 64 ids, smaller than the job's vocabulary: refused
Run by the ctest diloco_torchscript_python and by the C++ tests that need a module.
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class GruLm(nn.Module):
    def __init__(self, vocab: int, width: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.gru = nn.GRU(width, width, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(self.embed(tokens))
        logits = self.head(h)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class MixerLm(nn.Module):
    """Pre-norm token mixing over positions through a causal mask, then channel mixing per
    token, a final norm and a head tied to the embedding."""

    def __init__(self, vocab: int, width: int, context: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.token_mix = nn.Parameter(torch.randn(context, context) * 0.02)
        self.register_buffer("mask", torch.tril(torch.ones(context, context)))
        self.norm1 = nn.LayerNorm(width)
        self.norm2 = nn.LayerNorm(width)
        self.channel = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                     nn.Linear(2 * width, width))
        self.norm_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = tokens.size(1)
        x = self.embed(tokens)
        mix = (self.token_mix * self.mask)[:t, :t]
        x = x + torch.matmul(mix, self.norm1(x))
        x = x + self.channel(self.norm2(x))
        logits = self.head(self.norm_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class ForwardOneArg(GruLm):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        h, _ = self.gru(self.embed(tokens))
        return self.head(h).sum()


class PerToken(GruLm):
    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(self.embed(tokens))
        logits = self.head(h)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                               reduction="none")


class Dropout(GruLm):
    def __init__(self, vocab: int, width: int):
        super().__init__(vocab, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(self.drop(self.embed(tokens)))
        logits = self.head(h)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class BatchNormLm(GruLm):
    def __init__(self, vocab: int, width: int):
        super().__init__(vocab, width)
        self.bn = nn.BatchNorm1d(width)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(self.embed(tokens))
        h = self.bn(h.transpose(1, 2)).transpose(1, 2)
        logits = self.head(h)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def save(model: nn.Module, out: str, name: str) -> None:
    torch.jit.script(model).save(os.path.join(out, name))


def write_all(out: str, vocab: int = 256, width: int = 32, context: int = 32) -> None:
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    save(GruLm(vocab, width), out, "gru.pt")
    torch.manual_seed(1)
    save(GruLm(vocab, width), out, "gru_other.pt")
    torch.manual_seed(2)
    save(MixerLm(vocab, width, context), out, "mixer.pt")
    save(ForwardOneArg(vocab, width), out, "forward_one_arg.pt")
    save(PerToken(vocab, width), out, "per_token.pt")
    save(Dropout(vocab, width), out, "dropout.pt")
    save(BatchNormLm(vocab, width), out, "batchnorm.pt")
    save(GruLm(vocab, width).double(), out, "float64.pt")
    save(GruLm(64, width), out, "vocab64.pt")


if __name__ == "__main__":
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("out")
    a.add_argument("--vocab", type=int, default=256)
    a.add_argument("--width", type=int, default=32)
    a.add_argument("--context", type=int, default=32)
    args = a.parse_args()
    write_all(args.out, args.vocab, args.width, args.context)
