#!/usr/bin/env bash
# Three hosts as network namespaces (veth pairs on a bridge, each link shaped
# to 4 Mbit/s so that the all-reduce takes seconds), a head and Redis on the
# bridge's address, one worker per host. After round 2 one host is cut off
# (its veth set down) while the round's all-reduce runs: the job must go on
# with the other two; then the link comes back: the host joins again as a new
# node and the worker rejoins the job, which ends with 3 workers.
# Needs root and iproute2; exits 77 (ctest: skipped) otherwise.
#   LOCO_BIN  folder of loco (default $LOCO_BUILD/bin)
set -euo pipefail
source "$(cd "$(dirname "$0")/../.." && pwd)/scripts/env.sh"
source "$LOCO_ROOT/tests/support/netns.sh"
LOCO_BIN="${LOCO_BIN:-$LOCO_BUILD/bin}"
SKIP=77
t0=$SECONDS
say() { echo "netns_test: [$((SECONDS - t0)) s] $*"; }
skip() { echo "SKIPPED: $*"; exit $SKIP; }
fail() { echo "FAILED: $*"; [ -n "${JOB:-}" ] && "$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" | tail -40; exit 1; }

[ "$(id -u)" = 0 ] || skip "not root"
command -v ip >/dev/null || skip "no iproute2"
ip netns list >/dev/null 2>&1 || skip "no network namespaces"
command -v redis-server >/dev/null || skip "no redis-server"

TAG="lc$$"                 # names unique to this run (interfaces: at most 15 chars)
BR="${TAG}br"
NET="10.$((100 + $$ % 100)).$(( ($$ / 100) % 250 )).0"
BASE="${NET%.0}"
WORK="$(mktemp -d /tmp/loco-netns-XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  netns_teardown "$BR" "${TAG}h1" "${TAG}h2" "${TAG}h3"
  [ -z "${LOCO_KEEP_LOGS:-}" ] && rm -rf "$WORK"
  true
}
trap cleanup EXIT

say "bridge $BR on $BASE.1/24, hosts ${TAG}h1..3"
netns_bridge "$BR" "$BASE.1/24"
for h in 1 2 3; do
  ns="${TAG}h$h"
  netns_host "$BR" "$ns" "${TAG}v$h" "${TAG}p$h" "$BASE.1$h/24"
  # Both directions shaped: the host's egress in the namespace, its ingress on the bridge side.
  ip netns exec "$ns" tc qdisc add dev "${TAG}p$h" root tbf rate 4mbit burst 32kbit latency 400ms
  tc qdisc add dev "${TAG}v$h" root tbf rate 4mbit burst 32kbit latency 400ms
done

# A corpus: Debian's license texts (always installed).
mkdir -p "$WORK/data/corpus"
for i in 1 2 3; do cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0; done \
  > "$WORK/data/corpus/licenses.txt"

REDIS_PORT=$(( 20000 + $$ % 20000 ))
HEAD_PORT=$(( REDIS_PORT + 1 ))
HEAD="$BASE.1:$HEAD_PORT"
redis-server --bind "$BASE.1" --port "$REDIS_PORT" --protected-mode no --save "" --appendonly no \
  --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 50); do redis-cli -h "$BASE.1" -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
export LOCO_PLUGIN_PATH="$LOCO_BUILD/plugins"
"$LOCO_BIN/loco" start --head --block --host "$BASE.1" --port "$HEAD_PORT" \
  --redis "redis://$BASE.1:$REDIS_PORT" --detect-ms 1500 >"$WORK/head.log" 2>&1 &
PIDS+=($!)
for h in 1 2 3; do
  ip netns exec "${TAG}h$h" "$LOCO_BIN/loco" start --block --address "$HEAD" --host "$BASE.1$h" \
    --resources cpu=1 >"$WORK/node$h.log" 2>&1 &
  PIDS+=($!)
done
for _ in $(seq 1 100); do
  [ "$("$LOCO_BIN/loco" status --address "$HEAD" 2>/dev/null | grep -c ' alive ')" -ge 3 ] && break
  sleep 0.2
done
"$LOCO_BIN/loco" status --address "$HEAD" | grep -c ' alive ' | grep -q 3 || fail "3 nodes did not join"

cat >"$WORK/job.yaml" <<YAML
name: netns
seed: 3
threads: 1
model: {layers: 2, width: 64, heads: 2, context: 32}
data: {dir: $WORK/data, tokenizer: byte, shards: 12, val_fraction: 0.05}
workers: {count: 3, min: 2, max_restarts: 5}
inner: {steps: 5, batch_size: 8, lr: 0.003, warmup: 5}
compression: fp32
rounds: 9
checkpoint: {every: 0, dir: $WORK/ckpt}
eval: {every: 5, batches: 2}
YAML
JOB="$("$LOCO_BIN/loco" submit --detach --address "$HEAD" "$WORK/job.yaml" | grep -o 'job-[0-9a-f]*' | head -1)"
[ -n "$JOB" ] || fail "no job id"
say "job $JOB submitted"

# The host of worker 1.
wait_log() {  # wait_log PATTERN SECONDS
  for _ in $(seq 1 $(( $2 * 5 ))); do
    "$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" 2>/dev/null | grep -q -- "$1" && return 0
    sleep 0.2
  done
  return 1
}
# Round reports are not log lines; wait for the third round to be under way:
# the all-reduce dominates a round on these links (about 2 s of 2.5).
for _ in $(seq 1 300); do
  n=$(grep -c '"round"' "$WORK/ckpt/$JOB/metrics.jsonl" 2>/dev/null || true)
  n=${n:-0}
  [ "$n" -ge 3 ] && break
  sleep 0.2
done
[ "${n:-0}" -ge 3 ] || fail "the job did not reach round 2"
STATUS="$("$LOCO_BIN/loco" status --address "$HEAD")"
NODE_ID="$(awk -v n="$JOB.worker-1" '$2 == n {print $4}' <<<"$STATUS" | head -1)"
VICTIM_ADDR="$(awk -v id="$NODE_ID" '$1 == id {print $2}' <<<"$STATUS" | head -1)"
VICTIM_ADDR="${VICTIM_ADDR%:*}"
VICTIM="${VICTIM_ADDR##*.}"; VICTIM="${VICTIM#1}"
[ -n "$VICTIM" ] || fail "where is worker 1?"
sleep 0.5  # into the round's all-reduce (not a synchronization: any point of the round must do)
say "cutting host $VICTIM off (${TAG}v$VICTIM down)"
ip link set "${TAG}v$VICTIM" down
wait_log "worker 1 left" 30 || fail "the cut-off worker was not dropped"
say "dropped: $("$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" | grep 'worker 1 left' | head -1)"
wait_log "going on with 2 workers" 30 || fail "the round did not complete with the other two"
say "restoring host $VICTIM"
ip link set "${TAG}v$VICTIM" up
wait_log "worker 1 joined at round" 90 || fail "worker 1 did not rejoin"
say "rejoined: $("$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" | grep 'worker 1 joined' | head -1)"
grep -q "joining again as node" "$WORK/node$VICTIM.log" || fail "host $VICTIM did not join again as a new node"

for _ in $(seq 1 600); do
  state="$("$LOCO_BIN/loco" jobs --address "$HEAD" | grep "$JOB" || true)"
  case "$state" in *succeeded*|*failed*|*cancelled*) break ;; esac
  sleep 0.5
done
echo "$state"
case "$state" in *succeeded*) ;; *) fail "job did not succeed: $state" ;; esac
last="$(tail -1 "$WORK/ckpt/$JOB/metrics.jsonl")"
echo "$last" | grep -q '"workers":3' || fail "the job did not end with 3 workers: $last"
say "PASSED: cut off mid-round, went on with 2, rejoined, ended with 3 workers"
