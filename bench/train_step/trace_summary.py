"""Sums up the Chrome traces that `bench_train_step --profile DIR` writes (3 steps of each
side under the PyTorch profiler): per step, the card's kernels by kind, how long it was busy
and how long idle between its first and last kernel. What makes one side faster than another
shows here: the same matrix products and attention everywhere, and a different count and time
of the small kernels around them (elementwise, norms, the optimizer).

  python3 bench/train_step/trace_summary.py DIR/loco.json DIR/python.json [...] [--steps 3]
"""
import argparse
import json
import os
import re

# Kinds of kernel, by name, first match wins.
KINDS = [
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm80_|splitK", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor_apply|foreach", re.I)),
    ("fused (triton)", re.compile(r"^triton_", re.I)),
]
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def kind_of(event):
    if event.get("cat") != "kernel":
        return "copies"
    for kind, pattern in KINDS:
        if pattern.search(event["name"]):
            return kind
    return "other (elementwise, norms, reductions)"


def busy_union(spans):
    total, end = 0.0, None
    for start, stop in sorted(spans):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def summarize(path, steps):
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") in GPU_CATS and "dur" in e]
    if not events:
        return None
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events]
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    by_kind = {}
    for e in events:
        k = kind_of(e)
        n, t = by_kind.get(k, (0, 0.0))
        by_kind[k] = (n + 1, t + float(e["dur"]))
    busy = busy_union(spans)
    return {
        "kernels": sum(1 for e in events if e["cat"] == "kernel") / steps,
        "span_ms": (last - first) / steps / 1e3,
        "busy_ms": busy / steps / 1e3,
        "idle_ms": ((last - first) - busy) / steps / 1e3,
        "kinds": {k: (n / steps, t / steps / 1e3) for k, (n, t) in by_kind.items()},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--steps", type=int, default=3, help="steps each trace holds")
    a = ap.parse_args()
    rows = [(os.path.splitext(os.path.basename(p))[0], summarize(p, a.steps)) for p in a.traces]
    print("per step (ms), from the card's kernels in each trace (%d steps)" % a.steps)
    print("%-10s %9s %9s %9s %9s" % ("side", "kernels", "span", "busy", "idle"))
    for name, r in rows:
        if r is None:
            print("%-10s (no GPU events)" % name)
            continue
        print("%-10s %9.0f %9.2f %9.2f %9.2f" % (name, r["kernels"], r["span_ms"], r["busy_ms"],
                                                   r["idle_ms"]))
    kinds = sorted({k for _, r in rows if r for k in r["kinds"]})
    print("\nkernel time by kind, ms per step (kernels per step)")
    print("%-40s" % "kind" + "".join("%20s" % name for name, _ in rows))
    for k in kinds:
        cells = []
        for _, r in rows:
            n, t = r["kinds"].get(k, (0, 0.0)) if r else (0, 0.0)
            cells.append("%20s" % ("%.2f (%.0f)" % (t, n)))
        print("%-40s" % k + "".join(cells))


if __name__ == "__main__":
    main()
