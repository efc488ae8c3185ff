#!/usr/bin/env python3
"""What the soak bench (issue "25 ·", item 4) watches for growth: every --every seconds, for each
process named on the command line, its resident memory, open file descriptors and threads (from
/proc); for each Redis, its key count and used memory (`redis-cli`, no shell); for each path, its
size on disk (a folder: the sum of its files). One JSON line per sample to --out. A process or
Redis that is gone reads as null, so restarts show as gaps, not as errors.

  bench/soak/sample.py --out samples.jsonl --every 30 --proc head=PID --proc node1=@PIDFILE \\
      --tree --redis redis=127.0.0.1:6379 --path logs=DIR --path checkpoints=DIR
  bench/soak/sample.py --report samples.jsonl --last-minutes 100

--report fits a least-squares line to each quantity over the last --last-minutes and prints its
slope per hour, its first and last value, and the bound it is held to (--bound NAME=PER_HOUR,
or the defaults below); it exits 1 when a slope is over its bound. With --faults (the soak's
faults.tsv) the slope is the one within the stretches between faults: each stretch has its own
level (a node that gains or loses a worker steps its memory up or down, a restarted peer's
reconnection adds descriptors once) and the stretches share one slope, fitted after leaving
out --settle seconds after each fault's moment. A step is not growth; what grows between the
faults, round after round, is. The net change over the window is printed beside it, so that a
fault that leaves something behind each time shows too.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import time

# Per hour, per process or store: what "flat" means for a run of two hours. RSS: allocator
# noise and caches that fill once stay well under 1 MB an hour once warm; descriptors and
# threads: none may leak at all, so less than one an hour; Redis: its keys are bounded by the
# job's (events are trimmed), so less than one key and 1 MB an hour; logs and checkpoints grow
# with rounds by design and are bounded by checkpoint.keep and the log's rotation, so their
# bound is set per run (--bound).
DEFAULT_BOUNDS = {"rss_mb": 1.0, "fds": 1.0, "threads": 1.0, "keys": 1.0, "redis_mb": 1.0}


def one_proc(pid):
    try:
        status = open(f"/proc/{pid}/status").read()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kb = int(fields.get("VmRSS", "0 kB").split()[0])
    return {"rss_mb": rss_kb / 1024.0, "fds": fds, "threads": int(fields.get("Threads", "0"))}


def descendants(pid):
    """pid's children, theirs and so on (from /proc/PID/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = open(f"/proc/{p}/task/{t}/children").read().split()
            except OSError:
                continue
            out += [int(k) for k in kids]
            todo += [int(k) for k in kids]
    return out


def proc_sample(value, tree):
    """One process, named by PID or by @FILE holding it (read each time: a restarted process
    writes its new PID there); with tree, summed over its descendants too (a node's workers).
    The sample carries the PID, so that a report fits each process's life on its own."""
    pid = value
    if value.startswith("@"):
        try:
            pid = open(value[1:]).read().split()[0]
        except (OSError, IndexError):
            return None
    if not pid.isdigit():
        return None
    s = one_proc(int(pid))
    if s is None:
        return None
    if tree:
        for kid in descendants(int(pid)):
            k = one_proc(kid)
            for q in k or {}:
                s[q] += k[q]
    s["pid"] = int(pid)
    return s


def redis_sample(address):
    host, _, port = address.rpartition(":")
    base = ["redis-cli", "-h", host, "-p", port]
    try:
        keys = subprocess.run(base + ["DBSIZE"], capture_output=True, text=True, timeout=5)
        info = subprocess.run(base + ["INFO", "memory"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if keys.returncode != 0 or not keys.stdout.strip().isdigit():
        return None
    used = next((int(l.split(":")[1]) for l in info.stdout.splitlines()
                 if l.startswith("used_memory:")), 0)
    return {"keys": int(keys.stdout.strip()), "redis_mb": used / 1e6}


def path_mb(path):
    if "*" in path:  # the files a pattern names (a folder's logs, not its checkpoints)
        return sum(path_mb(p) for p in glob.glob(path))
    if os.path.isfile(path):
        return os.path.getsize(path) / 1e6
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass  # removed while walking (a checkpoint pruned)
    return total / 1e6


def named(pairs, what):
    out = {}
    for p in pairs:
        name, sep, value = p.partition("=")
        if not sep or not name or not value:
            sys.exit(f"--{what} {p}: want NAME=VALUE")
        out[name] = value
    return out


def sample(a):
    procs, stores, paths = named(a.proc, "proc"), named(a.redis, "redis"), named(a.path, "path")
    t0 = time.monotonic()
    n = 0
    with open(a.out, "a") as out:
        while a.count <= 0 or n < a.count:
            line = {"t": round(time.monotonic() - t0, 3), "unix": time.time()}
            line["procs"] = {k: proc_sample(v, a.tree) for k, v in procs.items()}
            line["redis"] = {k: redis_sample(v) for k, v in stores.items()}
            line["paths"] = {k: path_mb(v) for k, v in paths.items()}
            out.write(json.dumps(line) + "\n")
            out.flush()
            n += 1
            if a.count <= 0 or n < a.count:
                time.sleep(max(0.0, t0 + n * a.every - time.monotonic()))


def slope_per_hour(points):
    """Least-squares slope of (seconds, value) points, per hour; None with fewer than 2."""
    if len(points) < 2:
        return None
    mt = sum(t for t, _ in points) / len(points)
    mv = sum(v for _, v in points) / len(points)
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return None
    return 3600.0 * sum((t - mt) * (v - mv) for t, v in points) / var


def within_slope_per_hour(points, cuts, settle):
    """The slope shared by the stretches between the cuts (fixed effects: each stretch its own
    level), per hour, leaving out the points within settle seconds after a cut; None when no
    stretch has 2 points at different times."""
    stretches = {}
    for t, v in points:
        if any(c <= t < c + settle for c in cuts):
            continue
        stretches.setdefault(sum(c <= t for c in cuts), []).append((t, v))
    num = den = 0.0
    for pts in stretches.values():
        if len(pts) < 2:
            continue
        mt = sum(t for t, _ in pts) / len(pts)
        mv = sum(v for _, v in pts) / len(pts)
        num += sum((t - mt) * (v - mv) for t, v in pts)
        den += sum((t - mt) ** 2 for t, _ in pts)
    return 3600.0 * num / den if den > 0 else None


def fault_cuts(path, first_unix, first_t):
    """The faults' moments (faults.tsv: unix seconds in its first column) on the samples' clock."""
    cuts = []
    for line in open(path):
        f = line.split("\t")
        if f and f[0].strip():
            cuts.append(float(f[0]) - first_unix + first_t)
    return sorted(cuts)


def series(lines):
    """{(kind, name, quantity): {life: [(t, value)]}} from the samples, nulls left out; a
    process's lives are its PIDs (a restart begins a new one), a store's and a path's one."""
    out = {}
    for l in lines:
        for kind in ("procs", "redis"):
            for name, s in l.get(kind, {}).items():
                life = (s or {}).get("pid", 0)
                for q, v in (s or {}).items():
                    if q != "pid":
                        out.setdefault((kind, name, q), {}).setdefault(life, []).append((l["t"], v))
        for name, v in l.get("paths", {}).items():
            out.setdefault(("paths", name, "mb"), {}).setdefault(0, []).append((l["t"], v))
    return out


def report(a):
    lines = [json.loads(l) for l in open(a.report) if l.strip()]
    if not lines:
        sys.exit(f"{a.report}: no samples")
    start = lines[-1]["t"] - 60.0 * a.last_minutes
    bounds = dict(DEFAULT_BOUNDS)
    for k, v in named(a.bound, "bound").items():
        bounds[k] = float(v)
    cuts = fault_cuts(a.faults, lines[0]["unix"], lines[0]["t"]) if a.faults else []
    over = 0
    nan = float("nan")
    head = "within/h" if cuts else "slope/h"
    print(f"{'what':32} {'first':>10} {'last':>10} {'net':>9} {'slope/h':>9} {head:>9} "
          f"{'bound/h':>8}")
    for (kind, name, q), lives in sorted(series(lines).items()):
        # The longest life within the window: a restart's fresh start is not a slope.
        pts = max(([p for p in life if p[0] >= start] for life in lives.values()), key=len)
        raw = slope_per_hour(pts)
        s = within_slope_per_hour(pts, cuts, a.settle) if cuts else raw
        key = name if kind == "paths" else q
        bound = bounds.get(key)
        bad = s is not None and bound is not None and s > bound
        over += bad
        first, last = (pts[0][1], pts[-1][1]) if pts else (nan, nan)
        print(f"{kind + ' ' + name + ' ' + q:32} {first:10.3f} {last:10.3f} {last - first:9.3f} "
              f"{raw if raw is not None else nan:9.3f} {s if s is not None else nan:9.3f} "
              f"{bound if bound is not None else nan:8.2f}{'  OVER' if bad else ''}")
    return 1 if over else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="where the samples go (JSON lines, appended)")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--count", type=int, default=0, help="samples to take (0: until killed)")
    ap.add_argument("--proc", action="append", default=[], help="NAME=PID or NAME=@PIDFILE")
    ap.add_argument("--tree", action="store_true", help="each process with its descendants")
    ap.add_argument("--redis", action="append", default=[], help="NAME=HOST:PORT")
    ap.add_argument("--path", action="append", default=[], help="NAME=FILE_OR_FOLDER")
    ap.add_argument("--report", help="a samples file to fit instead")
    ap.add_argument("--last-minutes", type=float, default=100.0)
    ap.add_argument("--bound", action="append", default=[], help="QUANTITY_OR_PATH_NAME=PER_HOUR")
    ap.add_argument("--faults", help="faults.tsv: fit the slope within the stretches between them")
    ap.add_argument("--settle", type=float, default=120.0,
                    help="seconds after each fault's moment left out of the fit")
    a = ap.parse_args()
    if a.report:
        sys.exit(report(a))
    if not a.out:
        sys.exit("--out or --report is needed")
    sample(a)


if __name__ == "__main__":
    main()
