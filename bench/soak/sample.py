#!/usr/bin/env python3
"""What the soak bench (issue "25 ·", item 4) watches for growth: every --every seconds, for each
process named on the command line, its resident memory, open file descriptors and threads (from
/proc); for each Redis, its key count and used memory (`redis-cli`, no shell); for each path, its
size on disk (a folder: the sum of its files). One JSON line per sample to --out. A process or
Redis that is gone reads as null, so restarts show as gaps, not as errors.

  bench/soak/sample.py --out samples.jsonl --every 30 --proc head=PID --proc node1=@PIDFILE \\
      --tree --actor-log node1=node1.log --redis redis=127.0.0.1:6379 --path logs=DIR \\
      --path checkpoints=DIR
  bench/soak/sample.py --report samples.jsonl --last-minutes 100

--report fits a least-squares line to each quantity over the last --last-minutes and prints its
slope per hour, its first and last value, and the bound it is held to (--bound NAME=PER_HOUR,
or the defaults below); it exits 1 when a slope is over its bound, or a quantity named with
--cap NAME=MAX went above MAX in the window. A folder's slope is that of its tops (the largest
size in each --envelope-minutes): checkpoints are written and pruned, a sawtooth, and what
`checkpoint.keep` bounds is how many rounds it holds (rounds_held, from the files' names). With --faults (the soak's
faults.tsv) the slope is the one within the stretches between faults: each stretch has its own
level (a node that gains or loses a worker steps its memory up or down, a restarted peer's
reconnection adds descriptors once) and the stretches share one slope, fitted after leaving
out --settle seconds after each fault's moment. A step is not growth; what grows between the
faults, round after round, is. The net change over the window is printed beside it, so that a
fault that leaves something behind each time shows too. --pool NAME=PREFIX judges the processes
whose names begin with PREFIX together: one slope over all their stretches, with its standard
error, against NAME.QUANTITY's bound (the soak's training nodes, whose single slopes are lost in
the swings of their rounds).
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time

# Per hour, per process or store: what "flat" means for a run of two hours. RSS: allocator
# noise and caches that fill once stay well under 1 MB an hour once warm; descriptors and
# threads: none may leak at all, so less than one an hour; Redis: its keys are bounded by the
# job's (events are trimmed), so less than one key and 1 MB an hour; logs and checkpoints grow
# with rounds by design and are bounded by checkpoint.keep and the log's rotation, so their
# bound is set per run (--bound).
DEFAULT_BOUNDS = {"rss_mb": 1.0, "anon_mb": 1.0, "fds": 1.0, "threads": 1.0, "keys": 1.0, "redis_mb": 1.0,
                  "checkpoints.rounds_held": 1.0}


def one_proc(pid):
    try:
        status = open(f"/proc/{pid}/status").read()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    kb = lambda k: int(fields.get(k, "0 kB").split()[0])
    # RSS, and its anonymous part: the pages of mapped libraries (LibTorch's are hundreds of MB)
    # count in RSS as code paths are first run, while what a process allocates is anonymous.
    return {"rss_mb": kb("VmRSS") / 1024.0, "anon_mb": kb("RssAnon") / 1024.0, "fds": fds,
            "threads": int(fields.get("Threads", "0"))}


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


ROUND_FILE = re.compile(r"round-(\d+)")


def path_rounds(path):
    """The distinct rounds whose checkpoints a folder holds (files named ...round-N...)."""
    if "*" in path or not os.path.isdir(path):
        return None
    held = set()
    for _, _, files in os.walk(path):
        held.update(m.group(1) for m in map(ROUND_FILE.search, files) if m)
    return len(held)


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


def actor_changes(path):
    """How many actors a node's log says it created or killed so far: a node's memory steps
    when it takes a worker in or lets one go, so each count begins a new life of the node."""
    try:
        with open(path, errors="replace") as f:
            return sum(1 for line in f if ": created " in line or ": killed actor " in line)
    except OSError:
        return None


def named(pairs, what):
    out = {}
    for p in pairs:
        name, sep, value = p.partition("=")
        if not sep or not name or not value:
            sys.exit(f"--{what} {p}: want NAME=VALUE")
        out[name] = value
    return out


def procs_floor(procs, tree, reads, spread):
    """proc_sample of each process, its least values over `reads` reads `spread` seconds apart
    (all processes read together each time). A training node's memory swings by tens of MB
    within each inner step (a step's activations and logits come and go: 337 to 424 MB in 4 s
    on loopback, 2026-11-30), so that one read every 30 s lands on a random point of that swing
    and its noise hides any slope; the floor over a few steps is what the process holds between
    them, which is where a leak shows. The PID is the first read's (a read of a process that
    restarted meanwhile is left out)."""
    out = {k: proc_sample(v, tree) for k, v in procs.items()}
    for _ in range(reads - 1):
        time.sleep(spread)
        for k, v in procs.items():
            s = proc_sample(v, tree) if out[k] is not None else None
            if s is None or s["pid"] != out[k]["pid"]:
                continue
            for q in ("rss_mb", "anon_mb", "fds", "threads"):
                out[k][q] = min(out[k][q], s[q])
    return out


def sample(a):
    procs, stores, paths = named(a.proc, "proc"), named(a.redis, "redis"), named(a.path, "path")
    logs = named(a.actor_log, "actor-log")
    t0 = time.monotonic()
    n = 0
    with open(a.out, "a") as out:
        while a.count <= 0 or n < a.count:
            line = {"t": round(time.monotonic() - t0, 3), "unix": time.time()}
            reads = a.reads if a.reads > 0 else max(1, int(0.9 * a.every / a.spread))
            line["procs"] = procs_floor(procs, a.tree, reads, a.spread)
            for k, path in logs.items():
                if line["procs"].get(k) is not None:
                    line["procs"][k]["changes"] = actor_changes(path)
            line["redis"] = {k: redis_sample(v) for k, v in stores.items()}
            line["paths"] = {k: path_mb(v) for k, v in paths.items()}
            line["rounds_held"] = {k: path_rounds(v) for k, v in paths.items()}
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


def within_fit(lives, cuts, settle):
    """The slope shared by every life's stretches between the cuts (fixed effects: each life
    and stretch its own level), per hour, leaving out the points within settle seconds after a
    cut or a life's start, with its standard error per hour and the points' spread about their
    stretch's line; None when no stretch has 2 points at different times. A life is a
    process's PID (a restarted head is two) and, for a node, the actors it has had so far
    (--actor-log): a worker that moves from one node to another begins a life of each, not a
    step in a node's memory."""
    stretches = {}
    for life, points in lives.items():
        born = points[0][0] if points else 0.0
        for t, v in points:
            if t < born + settle or any(c <= t < c + settle for c in cuts):
                continue
            stretches.setdefault((life, sum(c <= t for c in cuts)), []).append((t, v))
    fitted = [pts for pts in stretches.values() if len(pts) >= 2]
    num = den = 0.0
    for pts in fitted:
        mt = sum(t for t, _ in pts) / len(pts)
        mv = sum(v for _, v in pts) / len(pts)
        num += sum((t - mt) * (v - mv) for t, v in pts)
        den += sum((t - mt) ** 2 for t, _ in pts)
    if den <= 0:
        return None
    b = num / den
    rss, n = 0.0, 0
    for pts in fitted:
        mt = sum(t for t, _ in pts) / len(pts)
        mv = sum(v for _, v in pts) / len(pts)
        rss += sum(((v - mv) - b * (t - mt)) ** 2 for t, v in pts)
        n += len(pts)
    dof = n - len(fitted) - 1
    spread = (rss / dof) ** 0.5 if dof > 0 else float("nan")
    return 3600.0 * b, 3600.0 * spread / den ** 0.5, spread


def within_slope_per_hour(lives, cuts, settle):
    """within_fit's slope alone."""
    fit = within_fit(lives, cuts, settle)
    return fit[0] if fit else None


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
    process's lives are its PIDs (a restart begins a new one) and, for a node, its actor
    changes; a store's and a path's one."""
    out = {}

    def add(key, life, t, v):
        out.setdefault(key, {}).setdefault(life, []).append((t, v))

    for l in lines:
        t = l["t"]
        for kind in ("procs", "redis"):
            for name, s in l.get(kind, {}).items():
                s = s or {}
                # A process's life: its PID, and for a node, the actors it has had so far.
                life = (s.get("pid", 0), s.get("changes"))
                for q, v in s.items():
                    # ("self" and "kids": a node's own figures and its children's, in samples
                    # of 2026-11-29; the totals beside them are what counts.)
                    if q not in ("pid", "changes", "self", "kids"):
                        add((kind, name, q), life, t, v)
        for name, v in l.get("paths", {}).items():
            add(("paths", name, "mb"), 0, t, v)
        for name, v in (l.get("rounds_held") or {}).items():
            if v is not None:
                add(("paths", name, "rounds_held"), 0, t, v)
    return out


def envelope(points, window):
    """The largest value in each window-long span: a folder that fills and is pruned (the
    checkpoints, `checkpoint.keep`) is flat when its tops are."""
    if not points:
        return []
    out, t0 = [], points[0][0]
    span = []
    for t, v in points:
        if t >= t0 + window and span:
            out.append(max(span, key=lambda p: p[1]))
            span, t0 = [], t
        span.append((t, v))
    if span:
        out.append(max(span, key=lambda p: p[1]))
    return out


def report(a):
    lines = [json.loads(l) for l in open(a.report) if l.strip()]
    if not lines:
        sys.exit(f"{a.report}: no samples")
    start = lines[-1]["t"] - 60.0 * a.last_minutes
    bounds = dict(DEFAULT_BOUNDS)
    for k, v in named(a.bound, "bound").items():
        bounds[k] = float(v)
    caps = {k: float(v) for k, v in named(a.cap, "cap").items()}
    cuts = fault_cuts(a.faults, lines[0]["unix"], lines[0]["t"]) if a.faults else []
    over = 0
    nan = float("nan")
    head = "within/h" if cuts else "slope/h"
    print(f"{'what':32} {'first':>10} {'last':>10} {'net':>9} {'slope/h':>9} {head:>9} "
          f"{'bound/h':>8}")
    pools = named(a.pool, "pool")
    pooled = {}  # (pool, quantity): {(process, life): points}
    for (kind, name, q), lives in sorted(series(lines).items()):
        lives = {k: [p for p in v if p[0] >= start] for k, v in lives.items()}
        lives = {k: v for k, v in lives.items() if v}
        if not lives:
            continue
        pool = next((n for n, prefix in pools.items() if kind == "procs" and name.startswith(prefix)),
                    None)
        if pool is not None:
            for life, pts in lives.items():
                pooled.setdefault((pool, q), {})[(name, life)] = pts
        # first, last, net and the raw slope: of the longest life in the window.
        pts = max(lives.values(), key=len)
        raw = slope_per_hour(pts)
        if kind == "paths":
            # A folder's size and rounds held are a sawtooth (written, then pruned): the slope
            # of its tops, not cut at faults.
            s = slope_per_hour(envelope(pts, a.envelope_minutes * 60.0))
        else:
            s = within_slope_per_hour(lives, cuts, a.settle) if cuts else raw
        key = f"{name}.{q}" if kind == "paths" and q != "mb" else (name if kind == "paths" else q)
        # A process of a pool is judged with the others of its pool (below), not alone.
        bound = None if pool is not None else bounds.get(key)
        bad = s is not None and bound is not None and s > bound
        cap = caps.get(key)
        top = max(v for life in lives.values() for _, v in life)
        capped = cap is not None and top > cap
        over += bad or capped
        first, last = (pts[0][1], pts[-1][1]) if pts else (nan, nan)
        print(f"{kind + ' ' + name + ' ' + q:32} {first:10.3f} {last:10.3f} {last - first:9.3f} "
              f"{raw if raw is not None else nan:9.3f} {s if s is not None else nan:9.3f} "
              f"{bound if bound is not None else nan:8.2f}{'  OVER' if bad else ''}"
              f"{f'  max {top:g} > cap {cap:g}' if capped else ''}"
              f"{f'  (judged in pool {pool})' if pool is not None else ''}")
    # A pool: processes that run the same code under the same load (the training nodes), whose
    # single slopes are lost in their swings; their stretches fitted together share one slope,
    # judged against the pool's bound (NAME.QUANTITY, else QUANTITY's), its standard error beside.
    for (pool, q), lives in sorted(pooled.items()):
        fit = within_fit(lives, cuts, a.settle) if cuts else within_fit(lives, [], 0.0)
        if fit is None:
            continue
        slope, se, spread = fit
        bound = bounds.get(f"{pool}.{q}", bounds.get(q))
        bad = bound is not None and slope > bound
        over += bad
        print(f"{'pool ' + pool + ' ' + q:32} {len(lives):>4} lives, spread {spread:8.3f}, slope "
              f"{slope:9.3f} ± {se:7.3f} (standard error) {bound if bound is not None else nan:8.2f}"
              f"{'  OVER' if bad else ''}")
    return 1 if over else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="where the samples go (JSON lines, appended)")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--reads", type=int, default=0,
                    help="reads of each process per sample, its least values kept (procs_floor); "
                         "0: as many as fit in --every, the floor over the whole interval (the "
                         "llama's inner step takes seconds: ten reads in 5 s still landed inside "
                         "steps, and the floors swung by 200 MB in the rehearsal of 2026-11-30)")
    ap.add_argument("--spread", type=float, default=0.5, help="seconds between those reads")
    ap.add_argument("--count", type=int, default=0, help="samples to take (0: until killed)")
    ap.add_argument("--proc", action="append", default=[], help="NAME=PID or NAME=@PIDFILE")
    ap.add_argument("--tree", action="store_true", help="each process with its descendants")
    ap.add_argument("--actor-log", action="append", default=[],
                    help="NAME=LOG: process NAME's log, whose actor creations and kills begin "
                    "new lives of it in the report")
    ap.add_argument("--redis", action="append", default=[], help="NAME=HOST:PORT")
    ap.add_argument("--path", action="append", default=[], help="NAME=FILE_OR_FOLDER")
    ap.add_argument("--report", help="a samples file to fit instead")
    ap.add_argument("--last-minutes", type=float, default=100.0)
    ap.add_argument("--bound", action="append", default=[], help="QUANTITY_OR_PATH_NAME=PER_HOUR")
    ap.add_argument("--faults", help="faults.tsv: fit the slope within the stretches between them")
    ap.add_argument("--pool", action="append", default=[],
                    help="NAME=PREFIX: the processes whose name begins with PREFIX are judged "
                         "together (one slope over all their stretches), against NAME.QUANTITY's "
                         "bound, else QUANTITY's")
    ap.add_argument("--cap", action="append", default=[],
                    help="QUANTITY_OR_PATH_NAME=MAX: over when any sample in the window is above")
    ap.add_argument("--envelope-minutes", type=float, default=20.0,
                    help="a folder's slope is its largest size in each span this long")
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
