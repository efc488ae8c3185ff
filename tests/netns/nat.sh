#!/usr/bin/env bash
# Peers behind NAT (issue 18): two sites, each behind its own NAT router namespace (iptables
# MASQUERADE, nothing forwarded in), 2 worker hosts per site, and one public host with Redis,
# the head and the relay; every host's link and each router's WAN link shaped with tbf (RATE,
# default 100mbit). No worker can dial another: every pair of workers exchanges through the
# relay, sealed end to end.
#   1. The nodes behind NAT are found reverse (one by the head's probe, one --no-listen).
#   2. A 4-worker job there reaches, round by round, the θ hashes of the same job on a flat
#      network (4 public hosts that dial each other directly), and so does a mixed one (2
#      workers behind NAT, one per site, and 2 public ones); and so does a streaming job
#      (2 fragments, the fragments' all-reduces overlapping the steps) in all three.
#   3. A second job: the relay is killed mid-round and started again on the same address; a
#      node behind NAT is killed and started again, joins as a new node (reverse) and its worker
#      rejoins; the job finishes.
# Needs root, iproute2, iptables and redis-server; exits 77 (ctest: skipped) otherwise.
source "$(cd "$(dirname "$0")" && pwd)/cluster.sh"
source "$LOCO_ROOT/tests/support/netns_nat.sh"
RATE="${RATE:-100mbit}"
command -v iptables >/dev/null || skip "no iptables"

HOSTS=9  # h1 public (Redis, head, relay); h2..h5 behind NAT; h6..h9 the flat network
trap 'nat_teardown 1 2; cluster_cleanup' EXIT
shape() {  # NS DEV: the device's egress to RATE
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 64kbit latency 400ms
}

PUB="$BASE.11"
say "public bridge $BR ($BASE.0/24), public host $PUB; sites 192.168.1.0/24 and 192.168.2.0/24"
netns_bridge "$BR" "$BASE.1/24"
netns_host "$BR" "${TAG}h1" "${TAG}v1" "${TAG}p1" "$PUB/24"
shape "${TAG}h1" "${TAG}p1"
for s in 1 2; do
  nat_site "$BR" "$s" "$BASE.2$s/24"
  shape "${TAG}r$s" wan
done
nat_host 1 "${TAG}h2" 1
nat_host 1 "${TAG}h3" 2
nat_host 2 "${TAG}h4" 1
nat_host 2 "${TAG}h5" 2
for h in 2 3 4 5; do shape "${TAG}h$h" "$(ip -n "${TAG}h$h" -o link show | awk -F'[ :@]+' '/'"$TAG"'p/ {print $2}')"; done
for h in 6 7 8 9; do
  netns_host "$BR" "${TAG}h$h" "${TAG}v$h" "${TAG}p$h" "$BASE.1$h/24"
  shape "${TAG}h$h" "${TAG}p$h"
done
# Nothing gets in: the public host cannot open a connection to a host behind NAT.
if ip netns exec "${TAG}h1" timeout 3 bash -c "echo > /dev/tcp/192.168.1.11/22" 2>/dev/null; then
  fail "the public host reached a host behind NAT"
fi

redis_port=$((20000 + $$ % 20000))
head_port=$((redis_port + 1))
relay_port=$((redis_port + 2))
HEAD="$PUB:$head_port"
ip netns exec "${TAG}h1" redis-server --bind "$PUB" --port "$redis_port" --protected-mode no \
  --save "" --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 50); do
  ip netns exec "${TAG}h1" redis-cli -h "$PUB" -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.1
done

RELAY_KEY="$WORK/relay.key"
"$LOCO_BIN/loco" keygen --out "$RELAY_KEY" >/dev/null
start_relay() {
  ip netns exec "${TAG}h1" "$LOCO_BIN/loco" relay --bind "tcp://$PUB:$relay_port" \
    --relay-key "$RELAY_KEY" >>"$WORK/relay.log" 2>&1 &
  RELAY_PID=$!
  PIDS+=($RELAY_PID)
  for _ in $(seq 1 100); do
    grep -q ": forwarding" "$WORK/relay.log" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "the relay did not start: $(tail -3 "$WORK/relay.log")"
}
start_relay
RELAY_PUBLIC="$(grep -o 'public key [^ ]*' "$WORK/relay.log" | head -1 | awk '{print $3}')"
[ -n "$RELAY_PUBLIC" ] || fail "the relay printed no public key"

export LOCO_PLUGIN_PATH="$LOCO_BUILD/plugins"
ip netns exec "${TAG}h1" "$LOCO_BIN/loco" start --head --block --host "$PUB" --port "$head_port" \
  --redis "redis://$PUB:$redis_port" --detect-ms 1500 \
  --relay "tcp://$PUB:$relay_port" --relay-public-key "$RELAY_PUBLIC" >"$WORK/head.log" 2>&1 &
PIDS+=($!)

declare -A NODE_PID
start_node() {  # H [extra flags]: a node on host H (behind NAT for 2..5)
  local h="$1" host
  shift
  case "$h" in
    2) host=192.168.1.11 ;; 3) host=192.168.1.12 ;; 4) host=192.168.2.11 ;; 5) host=192.168.2.12 ;;
    *) host="$BASE.1$h" ;;
  esac
  ip netns exec "${TAG}h$h" "$LOCO_BIN/loco" start --block --address "$HEAD" --host "$host" \
    --resources cpu=1 --data-root "$WORK" --checkpoint-root "$WORK" "$@" \
    >>"$WORK/node$h.log" 2>&1 &
  NODE_PID[$h]=$!
  PIDS+=($!)
}
nodes_alive() {  # COUNT REACH SECS: until COUNT nodes are alive with reachability REACH
  local n=0
  for _ in $(seq 1 $(($3 * 5))); do
    n=$("$LOCO_BIN/loco" status --address "$HEAD" 2>/dev/null | grep ' alive ' | grep -c " $2 " || true)
    [ "${n:-0}" -ge "$1" ] && return 0
    sleep 0.2
  done
  return 1
}
start_node 2
start_node 3 --no-listen
start_node 4
start_node 5
nodes_alive 4 relayed 60 || fail "the 4 nodes behind NAT did not join as relayed: $("$LOCO_BIN/loco" status --address "$HEAD" | head -12)"
grep -q "not reachable from the head" "$WORK/node2.log" || fail "node 2 was not found unreachable by the probe"
say "4 nodes behind NAT joined, all relayed (behind NAT, the cluster has a relay):"
"$LOCO_BIN/loco" status --address "$HEAD" | grep ' alive ' | sed 's/^/    /'

cluster_corpus
job_file() {  # NAME WORKERS_MIN ROUNDS [SYNC [INNER_STEPS]]
  cat >"$WORK/$1.yaml" <<YAML
sync: ${4:-{mode: blocking\}}
name: $1
seed: 11
threads: 1
model: {layers: 2, width: 64, heads: 2, context: 32}
data: {dir: $WORK/data, tokenizer: byte, shards: 12, val_fraction: 0.05}
workers: {count: 4, min: $2, max_restarts: 5}
inner: {steps: ${5:-5}, batch_size: 8, lr: 0.003, warmup: 5}
compression: fp32
rounds: $3
checkpoint: {every: 0, dir: $WORK/ckpt}
eval: {every: 5, batches: 2}
YAML
}
hashes() { grep -o '"round":[0-9]*\|"theta_hash":"[0-9a-f]*"' "$WORK/ckpt/$1/metrics.jsonl" | paste -d' ' - -; }

# 2. θ hashes behind NAT against a flat network.
job_file nat 4 4
job_file stream 4 4 "{mode: streaming, fragments: 2, overlap_steps: 1, mix: 0.5}" 6
# run_both TOPOLOGY: the blocking and the streaming job, their job ids in TOPOLOGY_JOB, _STREAM
run_both() {
  submit "$WORK/nat.yaml"
  wait_job_end 300
  case "$STATE" in *succeeded*) ;; *) fail "the blocking job ($1) did not succeed: $STATE" ;; esac
  printf -v "${1}_JOB" '%s' "$JOB"
  submit "$WORK/stream.yaml"
  wait_job_end 300
  case "$STATE" in *succeeded*) ;; *) fail "the streaming job ($1) did not succeed: $STATE" ;; esac
  printf -v "${1}_STREAM" '%s' "$JOB"
}
run_both NAT
stop_nodes() { for h in "$@"; do kill -TERM "${NODE_PID[$h]}" 2>/dev/null || true; done
  for h in "$@"; do wait "${NODE_PID[$h]}" 2>/dev/null || true; done; }
# Mixed: 2 workers behind NAT (one per site) and 2 public ones, which the NATed ones reach over
# connections they open themselves (reverse); the NATed pair goes through the relay.
stop_nodes 3 5
for h in 6 7; do start_node "$h"; done
nodes_alive 2 direct 60 || fail "the 2 public nodes did not join as direct"
run_both MIXED
stop_nodes 2 4
for h in 8 9; do start_node "$h"; done
nodes_alive 4 direct 60 || fail "the 4 flat nodes did not join as direct"
run_both FLAT
say "behind NAT:   $(hashes "$NAT_JOB" | tr '\n' ' ')"
say "mixed:        $(hashes "$MIXED_JOB" | tr '\n' ' ')"
say "flat network: $(hashes "$FLAT_JOB" | tr '\n' ' ')"
[ "$(hashes "$NAT_JOB")" = "$(hashes "$FLAT_JOB")" ] || fail "θ hashes differ between NAT and flat"
[ "$(hashes "$MIXED_JOB")" = "$(hashes "$FLAT_JOB")" ] || fail "θ hashes differ between mixed and flat"
[ "$(hashes "$NAT_JOB" | wc -l)" -ge 4 ] || fail "too few rounds reported"
say "streaming, behind NAT: $(hashes "$NAT_STREAM" | tr '\n' ' ')"
say "streaming, flat:       $(hashes "$FLAT_STREAM" | tr '\n' ' ')"
[ "$(hashes "$NAT_STREAM")" = "$(hashes "$FLAT_STREAM")" ] || fail "streaming θ hashes differ between NAT and flat"
[ "$(hashes "$MIXED_STREAM")" = "$(hashes "$FLAT_STREAM")" ] || fail "streaming θ hashes differ between mixed and flat"
[ "$(hashes "$NAT_STREAM")" != "$(hashes "$NAT_JOB")" ] || fail "the streaming job gave the blocking one's hashes"
stop_nodes 6 7 8 9

# 3. The relay killed mid-round and started again; a node behind NAT killed and started again.
start_node 2
start_node 3 --no-listen
start_node 4
start_node 5
nodes_alive 4 relayed 60 || fail "the nodes behind NAT did not join again"
job_file faults 3 40
submit "$WORK/faults.yaml"
round_reached() {  # R SECS
  for _ in $(seq 1 $(($2 * 5))); do
    n=$(grep -c '"round"' "$WORK/ckpt/$JOB/metrics.jsonl" 2>/dev/null || true)
    [ "${n:-0}" -ge "$1" ] && return 0
    sleep 0.2
  done
  return 1
}
round_reached 2 120 || fail "the job did not reach round 2"
say "killing the relay (pid $RELAY_PID)"
kill -9 "$RELAY_PID"
sleep 2  # the relay stays away for a while (not a synchronization: any length must do)
start_relay
say "relay started again"
round_reached 5 180 || fail "no round completed after the relay came back"
# The host of worker 1: its node's id, as `loco status` lists the actor, in a node's log.
node="$("$LOCO_BIN/loco" status --address "$HEAD" | awk -v n="$JOB.worker-1" '$2 == n {print $4}' | head -1)"
V=""
for h in 2 3 4 5; do grep -q "node $node" "$WORK/node$h.log" 2>/dev/null && V=$h; done
[ -n "$V" ] || fail "which host runs worker 1 (node '$node')?"
say "killing the node of worker 1 (host $V, node $node)"
kill -9 "${NODE_PID[$V]}"
wait_log "worker 1 left" 60 || fail "the killed node's worker was not dropped"
start_node "$V"
wait_log "worker 1 joined at round" 120 || fail "the killed node's worker did not rejoin"
wait_job_end 300
case "$STATE" in *succeeded*) ;; *) fail "the job with faults did not succeed: $STATE" ;; esac
# The relay's death was seen and outlived: the head's note that it refused connections and was
# back. An all-reduce that had pairs on it when it died fails and is tried again; one that
# begins while it is away waits for it (decision 0054), so retries may be none.
"$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" >"$WORK/faults.log"
grep -q "cluster: the relay at .* does not accept connections" "$WORK/faults.log" ||
  fail "the job's log does not say that the relay was down"
grep -q "cluster: the relay at .* is reachable again" "$WORK/faults.log" ||
  fail "the job's log does not say that the relay came back"
say "while the relay was down: $(grep -c 'tried again' "$WORK/faults.log") retries; $(grep -m1 'worker 1 joined' "$WORK/faults.log")"
say "PASSED: behind NAT = mixed = flat (θ hashes of $(hashes "$NAT_JOB" | wc -l) rounds); relay killed and back, node killed and back, job finished"
