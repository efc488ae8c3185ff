#!/usr/bin/env bash
# Stragglers (issue "11 ·", item 4): K = 4 worker hosts, one of them 3x slower, fixed-H lockstep
# against time-budgeted rounds with the adaptive deadline, beside the same job with four equal
# workers, in one run on one cluster.
#
# Speeds are CPU quotas (cgroup v1 cpu.cfs_quota_us on each node's process, so every thread and
# child of the node counts): every worker host gets FAST cores, the slow host FAST/3. With the
# quotas summing to less than the machine, no worker runs faster because another is slow
# (a sleep-injected delay would hand the slow worker's share of a shared core to the others).
# 4 hosts in network namespaces (tests/netns/cluster.sh), links unshaped.
#
# Runs, each on the same cluster, one after the other:
#   equal     four equal workers at FAST, H steps a round, ROUNDS rounds       (the reference)
#   same_total  four equal workers with the heterogeneous cluster's total: (3 + 1/3) x FAST / 4
#             each, ROUNDS rounds (what the slow cluster could do at best)
#   lockstep  host 2 slow, H steps a round, ROUNDS rounds: every round waits for it
#   budget    host 2 slow, inner.budget: time (H x the median step) and workers.grace_max_s,
#             ending at the tokens of `equal` (token_budget, rounds 0: the last round is sized
#             to the tokens that remain)
#   budget_rounds  the same with a count of rounds (ROUNDS x 1.2 + 3), read at the first round
#             whose tokens pass `equal`'s: what a job without token_budget pays, a round's
#             tokens past them (not in RUNS by default)
# The inner learning rate is constant after its warmup (min_lr_ratio: 1): the schedule's length
# is rounds x H steps, which differs between the runs, and a cosine decay ending at different
# points would be compared instead of the rounds.
# Prints, per run, the wall time and the validation loss at the first round whose
# cumulative tokens reach those of `equal` (ROUNDS x H x 4 workers x 16 x 64 tokens), then each
# run's ratios to `equal` and to `same_total`. Since the slow cluster has 5/6 of the compute,
# no schedule brings it to `equal`'s tokens in less than 1.2x `equal`'s time. Needs root
# (skips with exit 77 otherwise).
#
#   sudo bench/stragglers/run.sh                  # FAST=0.4 ROUNDS=8 H=50
set -uo pipefail
FAST=${FAST:-0.4}
ROUNDS=${ROUNDS:-8}
H=${H:-50}
GRACE_MAX_S=${GRACE_MAX_S:-30}
WAIT_S=${WAIT_S:-1500}
RUNS=${RUNS:-equal same_total lockstep budget}
source "$(cd "$(dirname "$0")" && pwd)/../../tests/netns/cluster.sh"
PY="${LOCO_VENV}/bin/python"
CG=/sys/fs/cgroup/cpu
[ -w "$CG" ] || skip "no writable cgroup v1 cpu controller at $CG"

cd "$WORK"
cluster_up 4
cluster_corpus
# PIDS: redis, head, then the nodes of hosts 1..4 (ip netns exec replaces itself with loco).
source "$LOCO_ROOT/tests/support/cpu_groups.sh"
for h in 1 2 3 4; do
  g="$CG/loco-strag-$$-h$h"
  cpu_group "$g" || fail "cannot make cgroup $g"
  echo "${PIDS[$((h + 1))]}" >"$g/cgroup.procs" || fail "cannot move node $h into $g"
done
strag_cleanup() {
  cluster_cleanup
  cpu_groups_release
}
trap strag_cleanup EXIT

quota() {  # HOST CORES
  local period=100000
  awk -v c="$2" -v p=$period 'BEGIN {printf "%d\n", c * p}' >"$CG/loco-strag-$$-h$1/cpu.cfs_quota_us"
}
speeds() {  # SLOW_HOST (0: none; -1: all at the slow cluster's mean)
  for h in 1 2 3 4; do
    if [ "$1" = -1 ]; then
      quota "$h" "$(awk -v f="$FAST" 'BEGIN {print f * (3 + 1 / 3) / 4}')"
    elif [ "$h" = "$1" ]; then
      quota "$h" "$(awk -v f="$FAST" 'BEGIN {print f / 3}')"
    else
      quota "$h" "$FAST"
    fi
  done
}

REF_TOKENS=$((ROUNDS * H * 4 * 16 * 64))
job_file() {  # NAME ROUNDS|tokens INNER_EXTRA WORKERS_EXTRA
  local rounds="rounds: $2"
  [ "$2" = tokens ] && rounds="rounds: 0
token_budget: $((REF_TOKENS / 4))"
  cat <<JOB
name: strag-$1
seed: 1
threads: 1
model: {layers: 4, width: 128, heads: 4, context: 64, tied_embeddings: true}
data: {dir: data, tokenizer: byte, shards: 16, val_fraction: 0.05}
workers: {count: 4, min: 3$4}
inner: {steps: $H, batch_size: 16, lr: 0.003, warmup: 10, min_lr_ratio: 1, weight_decay: 0.1, grad_clip: 1.0$3}
outer: {lr: 0.7, momentum: 0.9, nesterov: true}
compression: fp32
$rounds
checkpoint: {every: 0, dir: checkpoints}
eval: {every: 1, batches: 4}
JOB
}

declare -A WALL LOSS TOKENS ROUND STEPS COSTS
# A first job on a fresh cluster tokenizes the corpus and warms the nodes' caches (26 s
# before its first round, where a later job starts in 3 s), and a job that follows another
# at new speeds meets the last one's teardown on a node just slowed (a start of 11.5 s where
# the next at the same speeds took 4.6): before each timed run, a short job at its speeds,
# untimed, so that the runs' walls compare.
warm_up() {
  job_file warmup 1 "" "" | sed "s/steps: $H,/steps: 2,/" >"$WORK/warmup.yaml"
  submit "$WORK/warmup.yaml"
  wait_job_end "$WAIT_S"
  case "$STATE" in *succeeded*) ;; *) fail "warm-up: the job did not succeed: ${STATE:-no end}" ;; esac
}

run() {  # NAME SLOW_HOST ROUNDS INNER_EXTRA WORKERS_EXTRA
  local name=$1 file="$WORK/$1.yaml"
  speeds "$2"
  warm_up
  job_file "$name" "$3" "$4" "$5" >"$file"
  submit "$file"
  wait_job_end "$WAIT_S"
  case "$STATE" in *succeeded*) ;; *) fail "$name: the job did not succeed: ${STATE:-no end after $WAIT_S s}" ;; esac
  local folder="$WORK/checkpoints/$JOB"
  "$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" >"$WORK/$name.log" 2>&1 || true
  # The first round whose cumulative tokens (all members) reach the reference's total.
  # Then where the time went up to that round: from submission to the first round's start
  # (spawning, init, the evaluation of round 0), the first round, the median of the others,
  # what a round spends beyond its slowest member's inner steps (the all-reduce, evaluation,
  # the aggregator; median), the rounds with a member past the deadline, and the tokens past
  # the reference's.
  read -r ROUND[$name] TOKENS[$name] WALL[$name] LOSS[$name] STEPS[$name] COSTS[$name] < <("$PY" - "$folder/metrics.jsonl" "$REF_TOKENS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
start = next(r["job_time"] for r in rows if r["round"] == 0)
rows = [r for r in rows if r["round"] > 0]
want = int(sys.argv[2])
total, pick, upto = 0, None, []
for r in rows:
    total += sum(m["tokens"] for m in r["members"])
    steps = "/".join(str(m["steps"]) for m in sorted(r["members"], key=lambda m: m["worker"]))
    pick = (r["round"], total, r["job_time"], r["val_loss"], steps)
    upto.append(r)
    if total >= want:
        break
times = [r["round_time"] for r in upto]
beyond = [r["round_time"] - max(m["seconds"] for m in r["members"]) for r in upto]
late = sum(1 for r in upto if r.get("late"))
costs = "%.1f/%.1f/%.1f/%.2f/%d/%+.1f%%" % (
    start, times[0], statistics.median(times[1:] or times), statistics.median(beyond), late,
    100.0 * (pick[1] - want) / want)
print(*pick, costs)
PY
)
  say "$name: round ${ROUND[$name]}, ${TOKENS[$name]} tokens, wall ${WALL[$name]} s, validation loss ${LOSS[$name]}, steps per worker in that round ${STEPS[$name]}; start/first/median round/beyond the inner steps (s)/late rounds/tokens past: ${COSTS[$name]}"
}

for r in $RUNS; do
  case "$r" in
    equal) run equal 0 "$ROUNDS" "" "" ;;
    same_total) run same_total -1 "$ROUNDS" "" "" ;;
    lockstep) run lockstep 2 "$ROUNDS" "" "" ;;
    budget) run budget 2 tokens ", budget: time" ", grace_max_s: $GRACE_MAX_S" ;;
    # 4 / (3 + 1/3) = 1.2x the rounds give the reference's tokens; a margin of 3 rounds.
    budget_rounds)
      run budget_rounds 2 $((ROUNDS * 12 / 10 + 3)) ", budget: time" ", grace_max_s: $GRACE_MAX_S" ;;
    *) fail "unknown run $r" ;;
  esac
done

echo
echo "# K = 4, tiny byte GPT (4 x 128, context 64, batch 16), H = $H, fp32; worker hosts at $FAST cores," \
  "the slow one at a third of that; the reference: $ROUNDS rounds of four equal workers"
printf '%-13s %6s %10s %8s %9s  %-20s %s\n' run round tokens wall_s val_loss "steps (last round)" \
  "start/first/median round/beyond inner (s)/late rounds/tokens past"
for r in $RUNS; do
  printf '%-13s %6s %10s %8s %9.4f  %-20s %s\n' "$r" "${ROUND[$r]}" "${TOKENS[$r]}" "${WALL[$r]}" \
    "${LOSS[$r]}" "${STEPS[$r]}" "${COSTS[$r]}"
done
for ref in equal same_total; do
  [ -n "${WALL[$ref]:-}" ] || continue
  for r in $RUNS; do
    [ "$r" = "$ref" ] && continue
    [ "$r" = equal ] && continue
    awk -v r="$r" -v ref="$ref" -v we="${WALL[$ref]}" -v w="${WALL[$r]}" -v le="${LOSS[$ref]}" -v l="${LOSS[$r]}" 'BEGIN {
      printf "%s / %s: wall %.2fx, validation loss %+.2f %%\n", r, ref, w / we, 100 * (l - le) / le }'
  done
done
