#!/usr/bin/env python3
"""torchft 0.2.0's DiLoCo on bench/overlap's job, for a side-by-side run with loco.

    torchft_worker.py lighthouse --bind ADDR:PORT --replicas N
    torchft_worker.py worker --rank R --workers N --addr ADDR --lighthouse http://ADDR:PORT \
        --data DIR --rounds R --out FILE.jsonl [--fragments P --delay D --alpha A]

The model is loco's gpt2 written in plain PyTorch (diloco/model/model.cpp: learned positions,
pre-norm blocks, fused qkv, tanh GELU MLP of 4x width, final LayerNorm, head tied to the token
embedding; loco's initialisation), the data the bytes of the corpus files, the inner optimizer
AdamW with loco's schedule (linear warmup, cosine to 0.1x over rounds x H steps, decay on
tensors of 2+ dimensions, betas 0.9/0.95) and the outer one SGD with Nesterov momentum, one
per fragment. A worker is a torchft replica group of one rank: its own TCPStore on its host's
address, a Manager (synchronous quorum, as DiLoCo requires) that asks the lighthouse for the
quorum, and Gloo between the replicas.

Fragments follow loco's cut (diloco/model/model.cpp, parameter_fragments): block i goes to fragment
i mod P, the embeddings and the final norm to fragment 0. With P = 1 and delay 0 this is
torchft's blocking DiLoCo; with P fragments each one is all-reduced every H / P steps, `delay`
steps after it was sent (at most H / P - 1), and merged with weight `alpha` on the local copy.

Each inner step's forward, backward, clip and AdamW are timed up to the optimizer's first
post-hook, registered before DiLoCo's, so the time torchft spends in its own hook (quorum,
all-reduce, outer step) is counted as round time and not as inner-step time. One JSONL line
per round of H steps: {"round", "worker", "steps", "seconds" (in inner steps), "round_time",
"sync" (in torchft's hooks), "loss" (mean training loss), "step_seconds" (each inner step's),
"step_cpu_seconds" (the process's CPU time in each, as loco's per-step "cpu_seconds")};
each worker's last line has "cpu_s" (the process's CPU seconds so far), worker 0's also
"val_loss" (2 batches of evenly spaced windows of the validation tail, as loco's eval: the
same windows, and at step 0 the same loss, since θ starts bit for bit as loco's).
"""
import argparse
import json
import math
import os
import resource
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


def cmd_lighthouse(a: argparse.Namespace) -> None:
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind=a.bind, min_replicas=a.replicas)
    print(f"lighthouse {server.address()} on {a.bind}, min_replicas {a.replicas}", flush=True)
    # Serves until the bench kills it; the bound is a backstop against a leaked process.
    time.sleep(a.max_s)
    server.shutdown()


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return h + self.fc_proj(F.gelu(self.fc(self.ln2(h)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, context: int, vocab: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)

    def init_weights(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        std_res = 0.02 / math.sqrt(2.0 * len(self.blocks))
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith(".bias"):
                    p.zero_()
                elif "ln" in name:
                    p.fill_(1.0)
                elif name.endswith("proj.weight"):
                    p.normal_(0.0, std_res, generator=gen)
                else:
                    p.normal_(0.0, 0.02, generator=gen)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe.weight[: idx.size(1)]
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)

    def loss(self, windows: torch.Tensor) -> torch.Tensor:
        logits = self(windows[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), windows[:, 1:].reshape(-1))


class Fragment(nn.Module):
    """A set of the model's modules, for torchft (which takes one nn.Module per fragment)."""

    def __init__(self, modules: list) -> None:
        super().__init__()
        self.parts = nn.ModuleList(modules)


def fragments(model: Gpt, count: int) -> list:
    parts = [[] for _ in range(count)]
    parts[0] += [model.wte, model.wpe, model.ln_f]
    for i, block in enumerate(model.blocks):
        parts[i % count].append(block)
    return [Fragment(p) for p in parts]


def corpus_bytes(data_dir: str) -> torch.Tensor:
    files = sorted(p for p in Path(data_dir).rglob("*") if p.is_file())
    if not files:
        sys.exit(f"torchft_worker: no corpus files under {data_dir}")
    raw = b"".join(p.read_bytes() for p in files)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)


def inner_lr(lr: float, warmup: int, step: int, total: int, min_ratio: float = 0.1) -> float:
    """diloco/round/trainer.cpp's inner_lr: linear warmup, then cosine to lr * min_ratio."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    low = lr * min_ratio
    return low + 0.5 * (lr - low) * (1.0 + math.cos(math.pi * progress))


def cmd_worker(a: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    from torchft.local_sgd import DiLoCo
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    tokens = corpus_bytes(a.data)
    n = tokens.numel()
    tail = int(n * a.val_fraction)
    train_end = n - tail
    # loco's 16 contiguous shards of the training split, handed out round robin.
    bounds = [train_end * s // a.shards for s in range(a.shards + 1)]
    mine = [(bounds[s], bounds[s + 1]) for s in range(a.rank, a.shards, a.workers)]
    w = a.context + 1
    gen = torch.Generator().manual_seed(a.seed * 1000 + a.rank)

    def batch() -> torch.Tensor:
        rows = []
        for _ in range(a.batch):
            lo, hi = mine[int(torch.randint(len(mine), (1,), generator=gen))]
            start = int(torch.randint(hi - lo - w + 1, (1,), generator=gen)) + lo
            rows.append(tokens[start : start + w])
        return torch.stack(rows)

    model = Gpt(a.layers, a.width, a.heads, a.context, 256)
    model.init_weights(a.seed)  # the same θ on every replica, so no sync at step 0
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    inner = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    frags = fragments(model, a.fragments)
    outer = [torch.optim.SGD(f.parameters(), lr=a.outer_lr, momentum=0.9, nesterov=True) for f in frags]

    store = torch.distributed.TCPStore(a.addr, a.store_port, is_master=True, wait_for_workers=False,
                                       timeout=timedelta(seconds=a.timeout_s))
    timeout = timedelta(seconds=a.timeout_s)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=None, state_dict=None,
        min_replica_size=a.workers, use_async_quorum=False, init_sync=False,
        replica_id=f"worker{a.rank}", store_addr=a.addr, store_port=a.store_port,
        rank=0, world_size=1, lighthouse_addr=a.lighthouse, hostname=a.addr, port=a.manager_port,
        timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout, max_retries=0)

    total = a.rounds * a.h
    marks = {}
    # Registered before DiLoCo's hooks, so it runs first: the end of the step's own work.
    def computed(*_):
        marks["computed"], marks["cpu"] = time.perf_counter(), time.process_time()

    inner.register_step_post_hook(computed)
    out = open(a.out, "a")
    step = 0
    with DiLoCo(manager, frags, inner, outer, sync_every=a.h, backup_device=torch.device("cpu"),
                pin_memory=False, fragment_sync_delay=a.delay, fragment_update_alpha=a.alpha):
        # A quorum before the first step, as loco's round 0 comes before its first round: round
        # 1 then does not count the other workers' start (Python, torch, the corpus).
        manager.start_quorum()
        for r in range(1, a.rounds + 1):
            t_round = time.perf_counter()
            computing = syncing = loss_sum = 0.0
            step_seconds, step_cpu = [], []
            for _ in range(a.h):
                for g in inner.param_groups:
                    g["lr"] = inner_lr(a.lr, a.warmup, step, total)
                t0, c0 = time.perf_counter(), time.process_time()
                loss = model.loss(batch())
                inner.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
                inner.step()  # DiLoCo's hook: quorum, all-reduce, outer step when due
                t1 = time.perf_counter()
                computing += marks["computed"] - t0
                step_seconds.append(round(marks["computed"] - t0, 4))
                step_cpu.append(round(marks["cpu"] - c0, 4))  # the process's CPU in the step
                syncing += t1 - marks["computed"]
                loss_sum += float(loss.detach())
                step += 1
            rec = {"round": r, "worker": a.rank, "steps": a.h, "seconds": round(computing, 4),
                   "round_time": round(time.perf_counter() - t_round, 4), "sync": round(syncing, 4),
                   "loss": loss_sum / a.h, "manager_step": manager.current_step(),
                   "step_seconds": step_seconds, "step_cpu_seconds": step_cpu}
            if r == a.rounds:
                if a.rank == 0:
                    rec["val_loss"] = evaluate(model, tokens, train_end, a)
                use = resource.getrusage(resource.RUSAGE_SELF)
                rec["cpu_s"] = round(use.ru_utime + use.ru_stime, 2)  # the whole process's
            out.write(json.dumps(rec) + "\n")
            out.flush()
    manager.shutdown(wait=False)
    del store


def evaluate(model: Gpt, tokens: torch.Tensor, train_end: int, a: argparse.Namespace) -> float:
    """diloco/data/data.cpp's validation_windows: eval.batches x batch windows, evenly spaced."""
    n = a.eval_batches * a.batch
    w = a.context + 1
    span = tokens.numel() - train_end - w
    starts = [train_end + (span * j // (n - 1) if n > 1 else 0) for j in range(n)]
    windows = torch.stack([tokens[s : s + w] for s in starts])
    with torch.no_grad():
        losses = [float(model.loss(windows[i : i + a.batch])) for i in range(0, n, a.batch)]
    return sum(losses) / len(losses)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    lh = sub.add_parser("lighthouse")
    lh.add_argument("--bind", required=True)
    lh.add_argument("--replicas", type=int, required=True)
    lh.add_argument("--max-s", type=float, default=3600)
    wk = sub.add_parser("worker")
    for name, kind, default in [
        ("rank", int, None), ("workers", int, 4), ("addr", str, None), ("lighthouse", str, None),
        ("data", str, None), ("out", str, None), ("rounds", int, 4), ("h", int, 12),
        ("fragments", int, 1), ("delay", int, 0), ("alpha", float, 0.0),
        ("store-port", int, 29500), ("manager-port", int, 29510), ("timeout-s", float, 300),
        ("seed", int, 1), ("layers", int, 8), ("width", int, 256), ("heads", int, 4),
        ("context", int, 64), ("batch", int, 16), ("lr", float, 0.003), ("warmup", int, 4),
        ("weight-decay", float, 0.1), ("grad-clip", float, 1.0), ("outer-lr", float, 0.7),
        ("shards", int, 16), ("val-fraction", float, 0.05), ("eval-batches", int, 2)]:
        wk.add_argument(f"--{name}", type=kind, default=default, required=default is None)
    a = p.parse_args()
    cmd_lighthouse(a) if a.cmd == "lighthouse" else cmd_worker(a)


if __name__ == "__main__":
    main()
