# A loco cluster on hosts made of network namespaces, for the netns tests (sourced; needs
# root, iproute2 and redis-server; skips with exit 77 otherwise).
#
#   cluster_up N             bridge TAGbr on BASE.1/24 with Redis and the head on it, hosts
#                            TAGh1..N (BASE.11..; their veths TAGv<i> on the bridge side,
#                            TAGp<i> inside), one node per host, all alive; links unshaped
#   cluster_corpus           a small corpus in $WORK/data (Debian's license texts)
#   submit FILE              submits a job file, sets JOB
#   wait_log PATTERN SECS    until the job's log has PATTERN (1 if it never does)
#   wait_job_end SECS        until the job ends; sets STATE to its line of `loco jobs`
#   worker_host I            the host number (1..N) that runs worker I of $JOB
#   say / skip / fail        progress, exit 77, exit 1 (with the job's log)
# Everything (processes, namespaces, $WORK unless LOCO_KEEP_LOGS is set) goes on exit.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/env.sh"
source "$LOCO_ROOT/tests/support/netns.sh"
LOCO_BIN="${LOCO_BIN:-$LOCO_BUILD/bin}"
t0=$SECONDS
say() { echo "netns_test: [$((SECONDS - t0)) s] $*"; }
skip() { echo "SKIPPED: $*"; exit 77; }
fail() {
  echo "FAILED: $*"
  [ -n "${JOB:-}" ] && "$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" | tail -40
  exit 1
}

[ "$(id -u)" = 0 ] || skip "not root"
command -v ip >/dev/null || skip "no iproute2"
ip netns list >/dev/null 2>&1 || skip "no network namespaces"
command -v redis-server >/dev/null || skip "no redis-server"

TAG="lc$$"                 # names unique to this run (interfaces: at most 15 chars)
BR="${TAG}br"
NET="10.$((100 + $$ % 100)).$(( ($$ / 100) % 250 )).0"
BASE="${NET%.0}"
WORK="$(mktemp -d /tmp/loco-netns-XXXXXX)"
# A cluster key of this run's own, for the head, the nodes and the commands that talk to
# them: nothing here may depend on a key the machine's user happens to have.
export LOCO_KEY="$WORK/cluster.key"
"$LOCO_BIN/loco" keygen --out "$LOCO_KEY" >/dev/null
PIDS=()
HOSTS=0
cluster_cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  netns_teardown "$BR" $(for h in $(seq 1 "$HOSTS"); do echo "${TAG}h$h"; done)
  [ -z "${LOCO_KEEP_LOGS:-}" ] && rm -rf "$WORK"
  true
}
trap cluster_cleanup EXIT

cluster_up() {
  HOSTS=$1
  say "bridge $BR on $BASE.1/24, hosts ${TAG}h1..$HOSTS"
  netns_bridge "$BR" "$BASE.1/24"
  for h in $(seq 1 "$HOSTS"); do
    netns_host "$BR" "${TAG}h$h" "${TAG}v$h" "${TAG}p$h" "$BASE.1$h/24"
  done
  local redis_port=$(( 20000 + $$ % 20000 ))
  local head_port=$(( redis_port + 1 ))
  HEAD="$BASE.1:$head_port"
  redis-server --bind "$BASE.1" --port "$redis_port" --protected-mode no --save "" \
    --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 50); do
    redis-cli -h "$BASE.1" -p "$redis_port" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  export LOCO_PLUGIN_PATH="$LOCO_BUILD/plugins"
  "$LOCO_BIN/loco" start --head --block --host "$BASE.1" --port "$head_port" \
    --redis "redis://$BASE.1:$redis_port" --detect-ms 1500 >"$WORK/head.log" 2>&1 &
  PIDS+=($!)
  for h in $(seq 1 "$HOSTS"); do
    ip netns exec "${TAG}h$h" "$LOCO_BIN/loco" start --block --address "$HEAD" \
      --host "$BASE.1$h" --resources cpu=1 --data-root "$WORK" --checkpoint-root "$WORK" \
      >"$WORK/node$h.log" 2>&1 &
    PIDS+=($!)
  done
  local alive=0
  for _ in $(seq 1 100); do
    alive=$("$LOCO_BIN/loco" status --address "$HEAD" 2>/dev/null | grep -c ' alive ' || true)
    [ "${alive:-0}" -ge "$HOSTS" ] && break
    sleep 0.2
  done
  [ "${alive:-0}" -ge "$HOSTS" ] || fail "$HOSTS nodes did not join"
}

cluster_corpus() {
  mkdir -p "$WORK/data/corpus"
  for _ in 1 2 3; do
    cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0
  done >"$WORK/data/corpus/licenses.txt"
}

submit() {
  JOB="$("$LOCO_BIN/loco" submit --detach --address "$HEAD" "$1" | grep -o 'job-[0-9a-f]*' | head -1)"
  [ -n "$JOB" ] || fail "no job id"
  say "job $JOB submitted"
}

wait_log() {
  for _ in $(seq 1 $(( $2 * 5 ))); do
    "$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" 2>/dev/null | grep -q -- "$1" && return 0
    sleep 0.2
  done
  return 1
}

wait_job_end() {
  STATE=""
  local end=$(( SECONDS + $1 ))
  while [ "$SECONDS" -lt "$end" ]; do
    STATE="$("$LOCO_BIN/loco" jobs --address "$HEAD" | grep "$JOB" || true)"
    case "$STATE" in *succeeded*|*failed*|*cancelled*) return 0 ;; esac
    sleep 0.5
  done
}

worker_host() {
  local status node addr
  status="$("$LOCO_BIN/loco" status --address "$HEAD")"
  node="$(awk -v n="$JOB.worker-$1" '$2 == n {print $4}' <<<"$status" | head -1)"
  addr="$(awk -v id="$node" '$1 == id {print $2}' <<<"$status" | head -1)"
  addr="${addr%:*}"
  addr="${addr##*.}"
  echo "${addr#1}"
}
