#!/usr/bin/env bash
# The soak bench (issue "25 ·"): three sites and a public host as network namespaces, one
# streaming job for SOAK_MINUTES, faults on a seeded schedule that overlap, every process
# sampled for growth (bench/soak/sample.py), and at the end what was lost and what grew.
#
#   public host h1: Redis (append-only file, as `loco up` runs it), the head, the relay
#   site A: h2..h4 on direct links at 100 Mbit/s (h9: a spare host of site A)
#   site B: h5, h6 behind NAT at 20 Mbit/s (h10: a spare host behind that NAT)
#   site C: h7, h8 behind NAT at 5 Mbit/s; h8's node at a third of the others' CPU (not in the
#   smoke)
#
# Faults, at seeded times (SEED) spread over the run, each written to $OUT/faults.tsv as it
# happens (unix seconds, name, what):
#   corrupt      the worker on one node sends Δ × 100 for 3 rounds (tests' fault plugin); the
#   head         head is killed and started again as the guard leaves that worker out; once
#                the guard removed it, the operator stops its host (so that the node fault's
#                worker waits for the new node rather than taking the freed one)
#   uplink       site C's uplink down for 90 s (SOAK_MINUTES < 30: 6 % of the run), then back
#   relay        the relay killed and started again
#   redis        Redis restarted (SIGTERM, its append-only file kept)
#   node         a node of site B with a worker killed; later a new node joins behind the
#                same NAT, its worker placed there, and
#   join-relay   the relay is restarted while that joiner copies its state
#   scale        `loco scale` down by 2 workers, later back up
#
#   SOAK_MINUTES=120 bench/soak/run.sh                    # the record (docs/benchmarks.md)
#   SOAK_MINUTES=5 bench/soak/run.sh                      # the smoke (ctest soak_smoke)
#
# Environment: SOAK_MINUTES (120), SEED (1), OUT (results: runs/soak-UTC), MODEL (llama: the
# llama-tiny of examples/ on data/kjv-bpe, which scripts/prepare-data makes; gpt: a byte-level
# GPT on the licenses corpus, the smoke's), SAMPLE_EVERY (30 s; the smoke 5 s), STRAGGLER (1:
# h8 at a third of the others' quota; the smoke 0), so that a short run can try the record's
# setting (MODEL=llama STRAGGLER=1 SOAK_MINUTES=10). Needs root,
# iproute2, iptables, redis-server and a cgroup v1 cpu controller; exits 77 (skipped) otherwise.
# Exits 1 when a check fails: the job did not succeed, members' θ hashes disagreed, a round was
# redone more often than the faults explain, a fault left no trace in the job's log, or (runs of
# 30 minutes or more) a quantity grew faster than its bound over the last 100 minutes.
source "$(cd "$(dirname "$0")" && pwd)/../../tests/netns/cluster.sh"
source "$LOCO_ROOT/tests/support/netns_nat.sh"
PY="${LOCO_VENV}/bin/python"
SOAK_MINUTES="${SOAK_MINUTES:-120}"
SEED="${SEED:-1}"
OUT="${OUT:-$LOCO_ROOT/runs/soak-$(date -u +%Y%m%d-%H%M)}"
SMOKE=$([ "$SOAK_MINUTES" -lt 30 ] && echo 1 || echo 0)
MODEL="${MODEL:-$([ "$SMOKE" = 1 ] && echo gpt || echo llama)}"
SAMPLE_EVERY="${SAMPLE_EVERY:-$([ "$SMOKE" = 1 ] && echo 5 || echo 30)}"
STRAGGLER="${STRAGGLER:-$([ "$SMOKE" = 1 ] && echo 0 || echo 1)}"
CG=/sys/fs/cgroup/cpu
[ -w "$CG" ] || skip "no writable cgroup v1 cpu controller at $CG"
command -v iptables >/dev/null || skip "no iptables"
PLUGIN="$LOCO_BUILD/plugins-testing/libloco_fault_injection.so"
[ -f "$PLUGIN" ] || skip "no fault-injection plugin at $PLUGIN (a build with tests)"
mkdir -p "$OUT"
rm -f "$OUT/samples.jsonl" "$OUT/timeline.jsonl"  # both are appended to
: >"$OUT/faults.tsv"
fault() {  # NAME begin|end WHAT: the fault's moments, in the table and on the terminal
  printf '%s\t%s\t%s\t%s\n' "$(date +%s.%N | cut -c1-14)" "$1" "$2" "$3" >>"$OUT/faults.tsv"
  say "fault $1 ($2): $3"
}

HOSTS=10
source "$LOCO_ROOT/tests/support/cpu_groups.sh"
soak_cleanup() {
  [ -n "${SAMPLER_PID:-}" ] && kill "$SAMPLER_PID" 2>/dev/null
  nat_teardown 1 2 3
  cluster_cleanup
  cpu_groups_release
}
trap soak_cleanup EXIT

# --- the hosts and links ---
shape() {  # NS DEV RATE: the device's egress
  if [ "$1" = - ]; then
    tc qdisc replace dev "$2" root tbf rate "$3" burst 64kbit latency 400ms
  else
    ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst 64kbit latency 400ms
  fi
}
PUB="$BASE.11"
say "public $PUB; site A $BASE.12-14 at 100 Mbit/s; sites B, C behind NAT at 20 and 5 Mbit/s"
netns_bridge "$BR" "$BASE.1/24"
netns_host "$BR" "${TAG}h1" "${TAG}v1" "${TAG}p1" "$PUB/24"
for h in 2 3 4 9; do
  netns_host "$BR" "${TAG}h$h" "${TAG}v$h" "${TAG}p$h" "$BASE.1$h/24"
  shape "${TAG}h$h" "${TAG}p$h" 100mbit  # up
  shape - "${TAG}v$h" 100mbit            # down
done
nat_site "$BR" 1 "$BASE.21/24"
nat_site "$BR" 2 "$BASE.22/24"
for s in 1 2; do
  rate=$([ "$s" = 1 ] && echo 20mbit || echo 5mbit)
  shape "${TAG}r$s" wan "$rate"   # the site's uplink
  shape - "${TAG}w$s" "$rate"     # its downlink
done
nat_host 1 "${TAG}h5" 1
nat_host 1 "${TAG}h6" 2
nat_host 1 "${TAG}h10" 3
nat_host 2 "${TAG}h7" 1
nat_host 2 "${TAG}h8" 2
host_addr() {
  case "$1" in
    5) echo 192.168.1.11 ;; 6) echo 192.168.1.12 ;; 10) echo 192.168.1.13 ;;
    7) echo 192.168.2.11 ;; 8) echo 192.168.2.12 ;; *) echo "$BASE.1$1" ;;
  esac
}

# --- Redis, relay, head ---
redis_port=$((20000 + $$ % 20000))
head_port=$((redis_port + 1))
relay_port=$((redis_port + 2))
dash_port=$((redis_port + 3))
HEAD="$PUB:$head_port"
mkdir -p "$WORK/redis" "$OUT/pids"
start_redis() {
  ip netns exec "${TAG}h1" redis-server --bind "$PUB" --port "$redis_port" --protected-mode no \
    --save "" --appendonly yes --appendfsync everysec --dir "$WORK/redis" \
    >>"$WORK/redis.log" 2>&1 &
  REDIS_PID=$!
  PIDS+=($!)
  echo "$REDIS_PID" >"$OUT/pids/redis"
  for _ in $(seq 1 100); do
    ip netns exec "${TAG}h1" redis-cli -h "$PUB" -p "$redis_port" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  fail "Redis did not start"
}
RELAY_KEY="$WORK/relay.key"
"$LOCO_BIN/loco" keygen --out "$RELAY_KEY" >/dev/null
start_relay() {
  local before
  before=$(grep -c ": forwarding" "$WORK/relay.log" 2>/dev/null || true)
  ip netns exec "${TAG}h1" "$LOCO_BIN/loco" relay --bind "tcp://$PUB:$relay_port" \
    --relay-key "$RELAY_KEY" >>"$WORK/relay.log" 2>&1 &
  RELAY_PID=$!
  PIDS+=($!)
  echo "$RELAY_PID" >"$OUT/pids/relay"
  for _ in $(seq 1 100); do
    [ "$(grep -c ": forwarding" "$WORK/relay.log" 2>/dev/null || true)" -gt "${before:-0}" ] && return 0
    sleep 0.1
  done
  fail "the relay did not start: $(tail -3 "$WORK/relay.log")"
}
export LOCO_PLUGIN_PATH="$LOCO_BUILD/plugins:$PLUGIN"
start_head() {
  ip netns exec "${TAG}h1" "$LOCO_BIN/loco" start --head --block --host "$PUB" --port "$head_port" \
    --redis "redis://$PUB:$redis_port" --detect-ms 3000 \
    --relay "tcp://$PUB:$relay_port" --relay-public-key "$RELAY_PUBLIC" \
    --dashboard-port "$dash_port" --dashboard-token-file "$WORK/dashboard.token" \
    >>"$WORK/head.log" 2>&1 &
  HEAD_PID=$!
  PIDS+=($!)
  echo "$HEAD_PID" >"$OUT/pids/head"
  for _ in $(seq 1 100); do
    "$LOCO_BIN/loco" status --address "$HEAD" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  fail "the head did not start: $(tail -3 "$WORK/head.log")"
}
start_redis
start_relay
RELAY_PUBLIC="$(grep -o 'public key [^ ]*' "$WORK/relay.log" | head -1 | awk '{print $3}')"
[ -n "$RELAY_PUBLIC" ] || fail "the relay printed no public key"
start_head

# --- nodes: each in a CPU group of its own (site C's h8 at a third) ---
FAST=$(awk 'BEGIN {print 1.7 / (6 + 1 / 3)}')  # 7 workers' quotas fill 1.7 of the 2 cores
declare -A NODE_PID
CORRUPT_ROUND="$WORK/corrupt-round"
quota() {  # H CORES
  awk -v c="$2" 'BEGIN {printf "%d\n", c * 100000}' >"$CG/loco-soak-$$-h$1/cpu.cfs_quota_us"
}
start_node() {  # H: at FAST cores (loading LibTorch takes seconds of CPU; h8 slows down later)
  local h="$1" g="$CG/loco-soak-$$-h$1"
  [ -d "$g" ] || cpu_group "$g" || fail "cannot make cgroup $g"
  quota "$h" "$FAST"
  # Every node can host the worker the corrupt fault names; the plugin acts only where it is.
  ip netns exec "${TAG}h$h" env LOCO_FAULT="worker=1,corrupt=scale,rounds=3,round_file=$CORRUPT_ROUND" \
    "$LOCO_BIN/loco" start --block --address "$HEAD" --host "$(host_addr "$h")" \
    --resources cpu=1 --data-root "$WORK" --checkpoint-root "$WORK" >>"$WORK/node$h.log" 2>&1 &
  NODE_PID[$h]=$!
  PIDS+=($!)
  echo "$!" >"$g/cgroup.procs"
  echo "$!" >"$OUT/pids/node$h"
}
alive_nodes() { "$LOCO_BIN/loco" status --address "$HEAD" 2>/dev/null | grep -c ' alive ' || true; }
for h in 2 3 4 5 6 7 8; do start_node "$h"; done
for _ in $(seq 1 300); do [ "$(alive_nodes)" -ge 7 ] && break; sleep 0.2; done
[ "$(alive_nodes)" -ge 7 ] || fail "7 nodes did not join: $("$LOCO_BIN/loco" status --address "$HEAD" | head -12)"
# The straggler: the record's h8 at a third of the others' quota. Not in the smoke, whose five
# minutes it would spend on a few rounds (with the smoke's tiny GPT, whose messaging weighs as
# much as its steps, a throttled node's worker runs 10 to 50 times slower than the others; with
# the llama 3.5 times: decision 0054).
if [ "$STRAGGLER" = 1 ]; then
  quota 8 "$(awk -v f="$FAST" 'BEGIN {print f / 3}')"
  say "7 nodes alive (h8 now at a third of the others' CPU):"
else
  say "7 nodes alive (the smoke: no straggler):"
fi
"$LOCO_BIN/loco" status --address "$HEAD" | grep ' alive ' | sed 's/^/    /'

# --- the job ---
if [ "$MODEL" = llama ]; then
  [ -f "$LOCO_ROOT/data/kjv-bpe/tokenizer.json" ] || fail "MODEL=llama needs data/kjv-bpe (scripts/prepare-data; see examples/llama-tiny.yaml)"
  cp -r "$LOCO_ROOT/data/kjv-bpe" "$WORK/kjv-bpe"  # the nodes read only under their data root
  MODEL_YAML="{arch: llama, layers: 4, width: 128, heads: 4, kv_heads: 2, mlp_hidden: 352, context: 64, vocab: 4096, tied_embeddings: true}"
  DATA_YAML="{format: tokens, dir: $WORK/kjv-bpe, tokenizer: $WORK/kjv-bpe/tokenizer.json, shards: 64}"
  H=30
  # The llama's fp32 fragments (about 2.6 MB) keep site C's 5 Mbit/s uplink full for seconds:
  # a keepalive waits behind the shaper's queue and TCP's loss recovery, and members fell
  # silent for 3 s (the default) though alive, failing round 1 of both first attempts of the
  # record (2026-11-29). What a user on such a link sets.
  ALLREDUCE_YAML="{peer_timeout_s: 10}"
else
  cluster_corpus
  MODEL_YAML="{layers: 2, width: 64, heads: 2, context: 32}"
  DATA_YAML="{dir: $WORK/data, tokenizer: byte, shards: 16, val_fraction: 0.05}"
  H=10
  ALLREDUCE_YAML="{peer_timeout_s: 3}"
fi
# Round checkpoints kept: the folder holds at most one more while the next is written, and its
# size follows the members' shards (about 15 MB each with the llama, 3 to 7 members): its tops
# may move by 4 x 2 x 15 = 120 MB in a window as membership changes, hence a bound of 150 MB/h
# on their slope, while a checkpoint left behind would add some 130 MB every few minutes. What
# keep bounds exactly is the rounds held (capped at keep + 1).
CKPT_KEEP=2
job_file() {  # NAME ROUNDS [MINUTES]
  cat >"$OUT/$1.yaml" <<YAML
name: $1
seed: $SEED
threads: 1
model: $MODEL_YAML
data: $DATA_YAML
workers: {count: 7, min: 3, max: 8, max_restarts: 1000}
inner: {steps: $H, batch_size: 16, lr: 0.003, warmup: $H}
outer: {lr: 0.7, momentum: 0.9, nesterov: true}
sync: {mode: streaming, fragments: 2, overlap_steps: 2, mix: 0.5}
compression: {kind: auto, sparse: false}
allreduce: $ALLREDUCE_YAML
guard: {evict_after: 3}
rounds: $2
time_limit_minutes: ${3:-0}
checkpoint: {every: 4, keep: $CKPT_KEEP, dir: $WORK/ckpt}
eval: {every: $((H * 10)), batches: 4}
YAML
}
# How long a round takes here, fault-free: a 4-round job first (also the nodes' warm-up),
# its median round from the third on.
job_file calibrate 4
submit "$OUT/calibrate.yaml"
wait_job_end $([ "$MODEL" = llama ] && echo 1200 || echo 600)  # the llama's 4 rounds: 523 s on 2026-11-29
case "$STATE" in *succeeded*) ;; *) fail "the calibration job did not succeed: $STATE" ;; esac
round_s=$("$PY" - "$WORK/ckpt/$JOB/metrics.jsonl" <<'EOF'
import json, sys
t = [json.loads(l)["time"] for l in open(sys.argv[1]) if l.strip()]
d = sorted(b - a for a, b in zip(t[2:], t[3:]))
print(max(0.5, d[len(d) // 2]))
EOF
)
# The job ends at its time limit (time_limit_minutes: the round planned once SOAK_MINUTES
# passed is its last), not at a count of rounds: its rounds took 31 to 145 s in one record
# (2026-11-30), as the straggler's worker came and went with the faults, and no calibration
# foresees that. ROUNDS, three times the calibrated count, is only the bound.
ROUNDS=$(awk -v m="$SOAK_MINUTES" -v s="$round_s" 'BEGIN {r = int(m * 60 / s); print 3 * (r < 8 ? 8 : r)}')
say "a round takes $round_s s fault-free: the soak job runs $SOAK_MINUTES minutes (at most $ROUNDS rounds)"
job_file soak "$ROUNDS" "$SOAK_MINUTES"
T0=$(date +%s)
submit "$OUT/soak.yaml"
SOAK_JOB="$JOB"
METRICS="$WORK/ckpt/$JOB/metrics.jsonl"
echo "$JOB" >"$OUT/job"

# --- the sampler ---
procs=(--proc head=@"$OUT/pids/head" --proc relay=@"$OUT/pids/relay" --proc redis=@"$OUT/pids/redis")
for h in 2 3 4 5 6 7 8 10; do
  procs+=(--proc "node$h=@$OUT/pids/node$h" --actor-log "node$h=$WORK/node$h.log")
done
"$PY" "$LOCO_ROOT/bench/soak/sample.py" --out "$OUT/samples.jsonl" --every "$SAMPLE_EVERY" \
  "${procs[@]}" --tree --redis "redis=$PUB:$redis_port" --path "logs=$WORK/*.log" \
  --path "checkpoints=$WORK/ckpt/$JOB" >"$OUT/sampler.log" 2>&1 &
SAMPLER_PID=$!
# The dashboard's log and timeline, with their times (the dashboard listens on h1's loopback).
ip netns exec "${TAG}h1" "$PY" "$LOCO_ROOT/bench/soak/timeline.py" --url "http://127.0.0.1:$dash_port" \
  --token-file "$WORK/dashboard.token" --job "$JOB" --out "$OUT/timeline.jsonl" \
  >"$OUT/timeline.log" 2>&1 &
TIMELINE_PID=$!
PIDS+=($TIMELINE_PID)

# --- the schedule ---
rounds_done() { local n; n=$(grep -c '"round"' "$METRICS" 2>/dev/null) || true; echo "${n:-0}"; }
job_log() { "$LOCO_BIN/loco" logs "$SOAK_JOB" --address "$HEAD" 2>/dev/null || true; }
job_over() {
  case "$("$LOCO_BIN/loco" jobs --address "$HEAD" 2>/dev/null | grep "$SOAK_JOB" || true)" in
    *succeeded*|*failed*|*cancelled*) return 0 ;;
  esac
  return 1
}
# The hosts whose nodes hold a worker of the job (alive, pending or restarting), on one line
# with a space around each (" 2 5 10 "), for `case`: `loco status` names each actor's node, and
# each node's log its id, at the start of the node's own lines ("[time] [level] node ID: ..."):
# its peers' ids appear in it too, further on (matched anywhere, the seventh record's hosts all
# looked busy, no idle node was stopped, and the killed worker went to one, not to the joiner).
# With an argument, the hosts of the job's actors whose names begin so (`worker_hosts
# aggregator`; `worker_hosts ""`: every actor of the job).
worker_hosts() {
  local placed h n line=" "
  placed=$("$LOCO_BIN/loco" status --address "$HEAD" 2>/dev/null |
    awk -v j="$SOAK_JOB.${1-worker}" 'index($2, j) == 1 && $5 != "dead" {print $4}') || true
  for h in 2 3 4 5 6 7 8 10; do
    for n in $placed; do
      if grep -qE "^\[[^]]*\] \[[a-z]+\] node $n[: ]" "$WORK/node$h.log" 2>/dev/null; then
        line+="$h "
        break
      fi
    done
  done
  echo "$line"
}
# A fault's moment: SECONDS since the job's start (the job ends at its minutes, so every fault
# meets it before its end); false once the job has ended. (By a share of the calibrated rounds
# too, as before the time limit, faults fired early: the rehearsal's corrupt fault at its second
# round, its node fault 9 minutes early.)
until_at() {  # SECONDS
  while [ $(( $(date +%s) - T0 )) -lt "$1" ]; do
    job_over && return 1
    sleep 1
  done
  ! job_over
}
until_log() {  # PATTERN SECS: until the job's log has PATTERN
  local end=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$end" ]; do
    job_log | grep -q -- "$1" && return 0
    job_over && return 1
    sleep 1
  done
  return 1
}
T=$((SOAK_MINUTES * 60))
DOWN=$([ "$SMOKE" = 1 ] && echo $((T * 6 / 100)) || echo 90)
# Each fault at its share of the run, moved by up to ±2 % of it (seeded).
read -r AT_CORRUPT AT_UPLINK AT_RELAY AT_REDIS AT_NODE AT_JOIN AT_SCALE_DOWN AT_SCALE_UP < <(
  "$PY" -c "import random, sys; r = random.Random($SEED); T = $T
print(*[int(T * (f + r.uniform(-0.02, 0.02))) for f in (0.08, 0.25, 0.35, 0.45, 0.55, 0.63, 0.72, 0.82)])")
printf 'offsets (s from the job start): corrupt+head %s, uplink %s, relay %s, redis %s, node %s, join+relay %s, scale %s/%s\n' \
  "$AT_CORRUPT" "$AT_UPLINK" "$AT_RELAY" "$AT_REDIS" "$AT_NODE" "$AT_JOIN" "$AT_SCALE_DOWN" "$AT_SCALE_UP" | tee "$OUT/schedule.txt"

schedule() {
  until_at "$AT_CORRUPT" || return 0
  r=$(( $(rounds_done) + 1 ))
  echo "$r" >"$CORRUPT_ROUND"
  fault corrupt begin "worker 1 sends Δ × 100 in rounds $r to $((r + 2))"
  if until_log "the guard left worker 1" $((T / 4)); then
    fault head begin "head killed (pid $HEAD_PID) as the guard leaves worker 1 out"
    kill -9 "$HEAD_PID"
    sleep 3
    start_head
    fault head end "head started again (pid $HEAD_PID)"
  fi
  # The operator takes the evicted worker's host out of the cluster: its slot never comes back,
  # and a free node would take the node fault's worker before the new node on h10 joins.
  # Its actor is stopped right after the removal is logged: until then every host looks busy.
  if until_log "worker 1 removed from the job" $((T / 4)); then
    local busy h stopped="" end=$(( $(date +%s) + 60 ))
    while [ -z "$stopped" ] && [ "$(date +%s)" -lt "$end" ]; do
      busy="$(worker_hosts "")"  # not the aggregator's either
      for h in 2 3 4 5 6 7 8; do
        case "$busy" in *" $h "*) continue ;; esac
        kill -9 "${NODE_PID[$h]}"
        fault corrupt end "worker 1 removed by the guard; its host h$h stopped (pid ${NODE_PID[$h]})"
        stopped=$h
        break
      done
      [ -n "$stopped" ] || sleep 1
    done
  fi

  until_at "$AT_UPLINK" || return 0
  fault uplink begin "site C's uplink down for $DOWN s"
  ip -n "${TAG}r2" link set wan down
  sleep "$DOWN"
  ip -n "${TAG}r2" link set wan up
  shape "${TAG}r2" wan 5mbit
  fault uplink end "site C's uplink back"

  until_at "$AT_RELAY" || return 0
  fault relay begin "relay killed (pid $RELAY_PID)"
  kill -9 "$RELAY_PID"
  sleep 2
  start_relay
  fault relay end "relay started again (pid $RELAY_PID)"

  until_at "$AT_REDIS" || return 0
  fault redis begin "Redis stopped (pid $REDIS_PID; SIGTERM, its append-only file kept)"
  kill -TERM "$REDIS_PID"
  wait "$REDIS_PID" 2>/dev/null || true
  sleep 2
  start_redis
  fault redis end "Redis started again (pid $REDIS_PID)"

  until_at "$AT_NODE" || return 0
  # Site B's node with a worker (h6, or h5 if the operator stopped h6, or h6 holds the job's
  # aggregator, the entry actor: its loss is the head-and-aggregator test's, not this fault's).
  local victim=6 busy h idle="" entry
  busy="$(worker_hosts "")"
  entry="$(worker_hosts entry)"
  case "$(worker_hosts)" in *" 6 "*) ;; *" 5 "*) victim=5 ;; esac
  case "$entry" in *" $victim "*) victim=$((11 - victim)) ;; esac
  # Nodes that host no worker (one that came back after the uplink's outage under a new id, say)
  # are taken out first, as an operator retires idle machines: the lost worker then waits for the
  # new node on h10, which the join and the relay's kill during its copy are about.
  for h in 2 3 4 5 6 7 8; do
    case "$busy" in *" $h "*) continue ;; esac
    kill -0 "${NODE_PID[$h]}" 2>/dev/null || continue
    kill -9 "${NODE_PID[$h]}"
    idle+=" h$h"
  done
  fault node begin "site B's node on h$victim killed (pid ${NODE_PID[$victim]})${idle:+; idle nodes stopped first:$idle}"
  kill -9 "${NODE_PID[$victim]}"

  until_at "$AT_JOIN" || return 0
  local joined
  joined=$(job_log | grep -c ' joined ' || true)
  fault join begin "a new node starts on h10, behind site B's NAT"
  start_node 10
  # The relay goes down as soon as a worker of the job is placed on the new node, before its
  # state has arrived.
  local seen="not seen placed there in 120 s"
  local end=$(( $(date +%s) + 120 ))
  while [ "$(date +%s)" -lt "$end" ] && ! job_over; do
    case "$(worker_hosts)" in *" 10 "*) seen="placed there"; break ;; esac
    sleep 0.2
  done
  fault join-relay begin "relay killed (pid $RELAY_PID) while the joiner on h10 copies its state ($seen; $(( $(job_log | grep -c ' joined ' || true) - joined )) joined since)"
  kill -9 "$RELAY_PID"
  sleep 2
  start_relay
  fault join-relay end "relay started again (pid $RELAY_PID)"

  until_at "$AT_SCALE_DOWN" || return 0
  fault scale-down begin "loco scale to 5 workers"
  "$LOCO_BIN/loco" scale "$SOAK_JOB" --workers 5 --address "$HEAD" >>"$OUT/scale.log" 2>&1 || true
  until_at "$AT_SCALE_UP" || return 0
  # Up once the job went down (a round stalled by an earlier fault may hold it back).
  until_log "scaled down to 5" $((T / 4)) || true
  fault scale-up begin "loco scale to 7 workers"
  "$LOCO_BIN/loco" scale "$SOAK_JOB" --workers 7 --address "$HEAD" >>"$OUT/scale.log" 2>&1 || true
}
schedule
say "the schedule is done; waiting for the job's end"
JOB="$SOAK_JOB"
wait_job_end $((T * 2 + 600))
kill "$SAMPLER_PID" 2>/dev/null
SAMPLER_PID=""
T1=$(date +%s)
job_log >"$OUT/job.log"
cp "$METRICS" "$OUT/metrics.jsonl" 2>/dev/null || true
cp "$(dirname "$METRICS")/attempts.jsonl" "$OUT/attempts.jsonl" 2>/dev/null || true
# The poller's last look (it stops once it finds nothing new after the job's end).
for _ in $(seq 1 60); do kill -0 "$TIMELINE_PID" 2>/dev/null || break; sleep 0.5; done
say "job $SOAK_JOB: $STATE after $((T1 - T0)) s"

# --- the checks ---
check=0
# A fault's trace in metrics.jsonl is on the round it falls in, or, when the job went back, on the
# first round redone (the undone rounds' cluster notes are carried there): up to about two rounds
# after it, longer than the default 180 s once a round takes over a minute (the llama: 123 s).
WINDOW=$(awk -v s="$round_s" 'BEGIN {w = 3 * s; printf "%.0f\n", (w < 180 ? 180 : w)}')
"$PY" "$LOCO_ROOT/bench/soak/check.py" --faults "$OUT/faults.tsv" --timeline "$OUT/timeline.jsonl" \
  --metrics "$OUT/metrics.jsonl" --attempts "$OUT/attempts.jsonl" --state "$STATE" --start "$T0" \
  --window "$WINDOW" | tee "$OUT/check.txt" || check=$?
if [ "$SMOKE" = 0 ]; then
  growth=0
  "$PY" "$LOCO_ROOT/bench/soak/sample.py" --report "$OUT/samples.jsonl" --last-minutes 100 \
    --faults "$OUT/faults.tsv" --bound logs=50 --bound checkpoints=150 \
    --pool nodes=node --bound nodes.rss_mb=60 --bound nodes.anon_mb=60 \
    --cap "checkpoints.rounds_held=$((CKPT_KEEP + 1))" | tee "$OUT/growth.txt" ||
    growth=$?
  "$PY" "$LOCO_ROOT/bench/soak/plot.py" --samples "$OUT/samples.jsonl" --faults "$OUT/faults.tsv" \
    --last-minutes 100 --out "$OUT/growth.png" || true
else
  "$PY" "$LOCO_ROOT/bench/soak/sample.py" --report "$OUT/samples.jsonl" --last-minutes 1000 \
    | tee "$OUT/growth.txt" || true
  growth=0  # five minutes say nothing of slopes per hour
fi
[ "$check" = 0 ] || fail "the soak's checks failed (above; $OUT)"
[ "$growth" = 0 ] || fail "a quantity grew past its bound (above; $OUT)"
say "PASSED: $(rounds_done) rounds in $((T1 - T0)) s under $(cut -f2 "$OUT/faults.tsv" | sort -u | wc -l) kinds of fault; results in $OUT"
