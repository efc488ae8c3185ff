"""Inner-step throughput of the same GPT in plain eager PyTorch, as an
OpenDiLoCo user would write it: nn.Module, torch.optim.AdamW (defaults),
clip_grad_norm_, warmup + cosine set per step. Called by bench/train_step
(the C++ binary) with the same model, batch, context, threads and steps, on the same
device (--device cuda: each step timed once the card is done with it; --bf16: the forward
pass under autocast to bfloat16; --compile: the model through torch.compile; --fused:
AdamW(fused=True) instead of its default; --profile PATH: 3 more steps under torch.profiler,
their Chrome trace at PATH, for trace_summary.py).
Prints one line: RESULT tokens_per_s=<median> cpu=<median share of a step on a CPU>
peak_bytes=<the most allocated on the GPU in a step, 0 on the CPU> params=<n>.
"""
import contextlib
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, d, heads, mlp_ratio):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, mlp_ratio * d)
        self.fc_proj = nn.Linear(mlp_ratio * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, layers, d, heads, context, mlp_ratio=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.blocks = nn.ModuleList([Block(d, heads, mlp_ratio) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif "ln" in name:
                nn.init.ones_(p)
            elif name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe.weight[:t]
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--fused", action="store_true",
                    help="torch.optim.AdamW(fused=True): one kernel per step, not its default")
    ap.add_argument("--profile", default="",
                    help="after the timed steps, 3 more under torch.profiler: a Chrome trace here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    model = GPT(a.vocab, a.layers, a.d_model, a.heads, a.context).to(dev)
    step_model = torch.compile(model) if a.compile else model
    autocast = (lambda: torch.autocast(a.device, dtype=torch.bfloat16)) if a.bf16 \
        else contextlib.nullcontext
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if a.fused else {}))
    data = torch.randint(0, a.vocab, (1 << 20,), dtype=torch.int64)
    total = a.steps + a.warmup_steps

    def train_step(step):
        starts = torch.randint(0, data.numel() - a.context - 1, (a.batch,))
        batch = torch.stack([data[s:s + a.context + 1] for s in starts.tolist()]).to(dev)
        lr = a.lr * min(1.0, (step + 1) / 10) * 0.5 * (1 + math.cos(math.pi * step / total))
        for g in opt.param_groups:
            g["lr"] = lr
        with autocast():
            loss = step_model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    times, cpu, peaks = [], [], []
    for step in range(total):
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        c0 = time.process_time()
        loss = train_step(step)
        if cuda:
            torch.cuda.synchronize(dev)
            peaks.append(torch.cuda.max_memory_allocated(dev))
        times.append(time.perf_counter() - t0)
        cpu.append((time.process_time() - c0) / times[-1])  # the share of the step on a CPU
    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            for step in range(total, total + 3):
                train_step(step)
            if cuda:
                torch.cuda.synchronize(dev)
        prof.export_chrome_trace(a.profile)
    med = statistics.median(times[a.warmup_steps:])
    n = sum(p.numel() for p in model.parameters())
    peak = max(peaks[a.warmup_steps:]) if peaks else 0
    print(f"RESULT tokens_per_s={a.batch * a.context / med:.1f} cpu={statistics.median(cpu[a.warmup_steps:]):.3f} "
          f"peak_bytes={peak} params={n} loss={loss:.4f} torch={torch.__version__}")


if __name__ == "__main__":
    main()
