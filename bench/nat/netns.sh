#!/usr/bin/env bash
# Peers behind NAT (issue 18): all-reduce time per operation for K = 4 members, one per host, in
# three topologies, in one run, against the bound each allows:
#   direct   4 public hosts on a public bridge, all reachable: they dial each other;
#   mixed    2 public hosts + 2 hosts behind NAT, one in each NAT site: public to NATed goes
#            over the NATed member's own connection (reverse), NATed to NATed through the relay;
#   relayed  4 hosts behind NAT (2 sites × 2 hosts): every pair through the relay.
# Then relayed again with no shaping anywhere: how fast the relay forwards at all. First, a
# reference without the collective (tcp): the 4 public hosts each send E/2 bytes to each of the
# 3 others at once over plain TCP (bench/nat/tcp_mesh.py), the bytes a member's link sends in
# one all-reduce: what TCP through the shaper achieves against the same bound.
# The relay (`loco relay`) runs on a public host of its own. Every host's egress, each NAT
# router's WAN egress and the relay host's egress are shaped by tc tbf to RATE_MBIT; members
# and relay use CURVE with a cluster key (loco keygen), and relayed payloads are sealed end to
# end, as in production. Each member (tests/collective/member_main.cpp, repeat mode) runs OPS
# all-reduces of FLOATS fp32 floats back to back; an operation's time is the slowest member's
# (each member times its allreduce() call), and the table gives the median over operations.
#
# Bounds (docs/guide/nat.md, "Members behind NAT"), E = 4·FLOATS bytes:
#   direct, mixed: each member's link sends 2(K−1)/K·E (butterfly reduce-scatter + all-gather);
#     in mixed the relay carries the NATed pair's m(m−1)·2E/K = E (m = 2), less, and each NAT
#     router's WAN only its one host's 2(K−1)/K·E;
#   relayed: the relay carries m(m−1)·2E/K = 2(K−1)·E (m = K) in and out: its link's egress.
# Payload bytes only: TCP/IP and Ethernet headers (what tbf counts) add about 4.5 %.
#
# The relay's CPU: utime + stime of the relay process (/proc/PID/stat) before and after the
# relayed runs, over the Gbit its host's interface sent meanwhile (tx_bytes in its namespace).
#
#   bench/nat/netns.sh                              # 100 Mbit/s, 5 × 6.4 M floats
#   RATE_MBIT=50 OPS=3 FLOATS=1600000 bench/nat/netns.sh
#   TOPOLOGIES="relayed unshaped" bench/nat/netns.sh
#   BURST=256kbit bench/nat/netns.sh                # tbf's bucket (default 128kbit)
# Needs root, iproute2 and iptables (exit 77 otherwise). Traffic stays in the namespaces it
# creates; everything it makes (namespaces, bridges, iptables rules, processes) goes on exit.
set -uo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/env.sh"
source "$LOCO_ROOT/tests/support/netns.sh"
source "$LOCO_ROOT/tests/support/netns_nat.sh"
LOCO_BIN="${LOCO_BIN:-$LOCO_BUILD/bin}"
RATE_MBIT="${RATE_MBIT:-100}"
BURST="${BURST:-128kbit}"
OPS="${OPS:-5}"
FLOATS="${FLOATS:-6400000}"
TIMEOUT_MS="${TIMEOUT_MS:-10000}"  # the members' peer_timeout
CHUNK="${CHUNK:-524288}"
TOPOLOGIES="${TOPOLOGIES:-tcp direct mixed relayed unshaped}"
K=4
t0=$SECONDS
say() { echo "bench/nat: [$((SECONDS - t0)) s] $*"; }
die() { say "FAILED: $*"; exit 1; }
[ "$(id -u)" = 0 ] || { echo "SKIPPED: not root"; exit 77; }
command -v ip >/dev/null && ip netns list >/dev/null 2>&1 || { echo "SKIPPED: no netns"; exit 77; }
command -v iptables >/dev/null || { echo "SKIPPED: no iptables"; exit 77; }
for b in loco collective_member; do
  [ -x "$LOCO_BIN/$b" ] || die "$LOCO_BIN/$b missing: scripts/build --target loco collective_member"
done

TAG="nb$(($$ % 100000))"
BR="${TAG}br"
BASE="10.$((100 + $$ % 100)).$(( ($$ / 100 + 11) % 250 ))"
WORK="$(mktemp -d /tmp/loco-bench-nat-XXXXXX)"
PIDS=()
PUB_HOSTS=(1 2 3 4 5)  # h1..h4: members; h5: the relay
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  nat_teardown 1 2
  netns_teardown "$BR" "${TAG}h1" "${TAG}h2" "${TAG}h3" "${TAG}h4" "${TAG}h5" \
    "${TAG}n11" "${TAG}n12" "${TAG}n21" "${TAG}n22"
  [ -z "${LOCO_KEEP_LOGS:-}" ] && rm -rf "$WORK"
  true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The network: a public bridge (no address: the machine's own namespace takes no part) with
# 5 public hosts and 2 NAT routers; 2 hosts behind each router.
SHAPED=()  # "NS DEV" of every shaped device
shape() {  # NS DEV
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${RATE_MBIT}mbit" burst "$BURST" latency 400ms
  SHAPED+=("$1 $2")
}
netns_bridge "$BR"
for h in "${PUB_HOSTS[@]}"; do
  netns_host "$BR" "${TAG}h$h" "${TAG}v$h" "${TAG}p$h" "$BASE.1$h/24"
  shape "${TAG}h$h" "${TAG}p$h"
done
for s in 1 2; do
  nat_site "$BR" "$s" "$BASE.2$s/24"
  shape "${TAG}r$s" wan
  for i in 1 2; do
    nat_host "$s" "${TAG}n$s$i" "$i"
    shape "${TAG}n$s$i" "${TAG}p$s$i"
  done
done
# Nothing gets in: a public host cannot open a connection to a host behind NAT.
if ip netns exec "${TAG}h1" timeout 3 bash -c "echo > /dev/tcp/192.168.1.11/22" 2>/dev/null; then
  die "a public host reached a host behind NAT"
fi
ip netns exec "${TAG}n11" timeout 3 bash -c "echo > /dev/tcp/192.168.2.11/22" 2>/dev/null &&
  die "a host behind NAT reached one in the other site"

# CURVE: a cluster key for the members, a key pair of its own for the relay.
KEY="$WORK/cluster.key"
"$LOCO_BIN/loco" keygen --out "$KEY" >/dev/null || die "loco keygen"
RELAY_NS="${TAG}h5"
RELAY_IF="${TAG}p5"
RELAY_EP="tcp://$BASE.15:7400"
ip netns exec "$RELAY_NS" "$LOCO_BIN/loco" relay --bind "$RELAY_EP" --key "$KEY" \
  --relay-key "$WORK/relay.key" >"$WORK/relay.log" 2>&1 &
RELAY_PID=$!
PIDS+=($RELAY_PID)
for _ in $(seq 1 100); do
  grep -q ": forwarding" "$WORK/relay.log" 2>/dev/null && break
  sleep 0.1
done
RELAY_PUBLIC="$(grep -o 'public key [^ ]*' "$WORK/relay.log" | head -1 | awk '{print $3}')"
[ -n "$RELAY_PUBLIC" ] || die "the relay did not start: $(tail -3 "$WORK/relay.log")"
say "public bridge $BASE.0/24: members h1..h4 ($BASE.11..14), relay h5 ($RELAY_EP); NAT sites" \
  "192.168.1.0/24 (WAN $BASE.21) and 192.168.2.0/24 (WAN $BASE.22), 2 hosts each"
say "${#SHAPED[@]} egress links shaped: tbf rate ${RATE_MBIT}mbit burst $BURST latency 400ms;" \
  "CURVE + sealing; $OPS all-reduces of $FLOATS floats (fp32), chunks of $CHUNK B," \
  "peer_timeout $TIMEOUT_MS ms; load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"

# CPU seconds (utime + stime) of process PID so far.
cpu_seconds() {
  local f
  f=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  f=${f##*) }  # the fields after the command's name; utime and stime are fields 14 and 15
  awk -v f="$f" -v hz="$(getconf CLK_TCK)" 'BEGIN {split(f, a, " "); printf "%.2f", (a[12] + a[13]) / hz}'
}
relay_bytes() {  # tx rx of the relay host's interface
  echo "$(ip netns exec "$RELAY_NS" cat "/sys/class/net/$RELAY_IF/statistics/tx_bytes")" \
    "$(ip netns exec "$RELAY_NS" cat "/sys/class/net/$RELAY_IF/statistics/rx_bytes")"
}
machine_busy() {  # "busy total" jiffies of all CPUs (/proc/stat)
  awk '/^cpu / {t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t}' /proc/stat
}
tbf_drops() {  # NS DEV...: packets the shapers dropped so far (queue full), summed
  local d total=0 n
  for d in "$@"; do
    n=$(ip netns exec ${d% *} tc -s qdisc show dev ${d#* } 2>/dev/null | grep -o 'dropped [0-9]*' | head -1 | awk '{print $2}')
    total=$((total + ${n:-0}))
  done
  echo $total
}
median() { sort -g | awk '{a[NR] = $1} END {if (NR == 0) print "-"; else printf "%.3f", (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }

E=$((4 * FLOATS))
# Seconds that B bytes take at RATE_MBIT.
secs_for() { awk -v b="$1" -v r="$RATE_MBIT" 'BEGIN {printf "%.3f", b * 8 / (r * 1e6)}'; }
BOUND_LINK=$(secs_for $((2 * (K - 1) * E / K)))
BOUND_RELAY=$(secs_for $((2 * (K - 1) * E)))

declare -A MED MIN MAX OK BOUND BUSY RCPU RGBIT RGBIT_IN RSUM MCPU RHWM DROPS RDROPS
# run_topology NAME MEMBER...: MEMBER is "NS ADDR" (reachable, binds tcp://ADDR:7300) or
# "NS nat" (outbound-only). Runs the members until they end (bounded) and fills the tables.
run_topology() {
  local name=$1 dir="$WORK/$1" i=0 m ns addr pids=() peers=() busy0 busy1 c0 c1 b0 b1
  shift
  mkdir -p "$dir"
  for i in $(seq 1 $K); do peers+=("w$i=?"); done
  read -r -a busy0 <<<"$(machine_busy)"
  c0=$(cpu_seconds "$RELAY_PID")
  read -r -a b0 <<<"$(relay_bytes)"
  local d0 rd0
  d0=$(tbf_drops "${SHAPED[@]}")
  rd0=$(tbf_drops "$RELAY_NS $RELAY_IF")
  local start=$SECONDS
  i=0
  for m in "$@"; do
    i=$((i + 1))
    read -r ns addr <<<"$m"
    local outbound=0 bind="tcp://127.0.0.1:0"
    if [ "$addr" = nat ]; then outbound=1; else bind="tcp://$addr:7300"; fi
    if [ "$name" = tcp ]; then  # the raw TCP reference: every public host sends to the others
      local others=() h
      for h in 11 12 13 14; do [ "$BASE.$h" = "$addr" ] || others+=("$BASE.$h"); done
      ip netns exec "$ns" python3 "$LOCO_ROOT/bench/nat/tcp_mesh.py" "$addr" 7301 $((E / 2)) \
        "$OPS" "${others[@]}" >"$dir/w$i.out" 2>"$dir/w$i.err" &
      pids+=($!)
      PIDS+=($!)
      continue
    fi
    ip netns exec "$ns" env LOCO_MEMBER_BIND="$bind" LOCO_MEMBER_OUTBOUND=$outbound \
      LOCO_MEMBER_KEY="$KEY" LOCO_MEMBER_RELAY="$RELAY_EP" LOCO_MEMBER_RELAY_KEY="$RELAY_PUBLIC" \
      LOCO_MEMBER_RENDEZVOUS="$dir" LOCO_MEMBER_TIMES=1 \
      "$LOCO_BIN/collective_member" "w$i" "$i" 100 "$FLOATS" 5 fp32 "$TIMEOUT_MS" "$CHUNK" \
      "repeat:$OPS" "${peers[@]}" >"$dir/w$i.out" 2>"$dir/w$i.err" &
    pids+=($!)
    PIDS+=($!)
  done
  # Bounded: 60 s to start, then ten times the slower bound per operation (every wait inside an
  # operation is bounded too).
  local limit
  limit=$(awk -v b="$BOUND_RELAY" -v o="$OPS" 'BEGIN {printf "%d", 60 + 10 * b * (o + 1)}')
  local deadline=$((SECONDS + limit))
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null; do
      if ((SECONDS >= deadline)); then
        say "$name: members still running after $limit s; stopping them"
        for q in "${pids[@]}"; do kill -9 "$q" 2>/dev/null || true; done
        break 2
      fi
      sleep 0.2
    done
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  local wall=$((SECONDS - start))
  c1=$(cpu_seconds "$RELAY_PID")
  read -r -a b1 <<<"$(relay_bytes)"
  DROPS[$name]=$(($(tbf_drops "${SHAPED[@]}") - d0))
  RDROPS[$name]=$(($(tbf_drops "$RELAY_NS $RELAY_IF") - rd0))
  read -r -a busy1 <<<"$(machine_busy)"
  # Operation j's time: the slowest member's; ok when every member has "ok" with one hash.
  local j ok=0 times=()
  for j in $(seq 1 "$OPS"); do
    local results t
    results=$(for i in $(seq 1 $K); do grep -E '^(ok|error) ' "$dir/w$i.out" | sed -n "${j}p"; done | sort -u)
    if [ "$(echo "$results" | wc -l)" = 1 ] && [ "${results#ok }" != "$results" ]; then
      ok=$((ok + 1))
      t=$(for i in $(seq 1 $K); do grep '^seconds ' "$dir/w$i.out" | sed -n "${j}p" | awk '{print $2}'; done | sort -g | tail -1)
      times+=("$t")
    else
      say "$name: operation $j failed or members disagree:"
      echo "$results" | head -4 | sed 's/^/    /'
    fi
  done
  OK[$name]="$ok/$OPS"
  MED[$name]=$(printf '%s\n' "${times[@]}" | median)
  MIN[$name]=$(printf '%s\n' "${times[@]}" | sort -g | head -1)
  MAX[$name]=$(printf '%s\n' "${times[@]}" | sort -g | tail -1)
  RSUM[$name]=$(printf '%s\n' "${times[@]}" | awk '{s += $1} END {printf "%.3f", s}')
  BUSY[$name]=$(awk -v a="${busy0[0]}" -v b="${busy1[0]}" -v c="${busy0[1]}" -v d="${busy1[1]}" \
    -v n="$(nproc)" 'BEGIN {printf "%.2f", (d > c ? (b - a) / (d - c) * n : 0)}')
  # The relay's peak RSS so far (VmHWM: since it started, so a topology's own peak only where it
  # is above the ones before).
  RHWM[$name]=$(awk '/^VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$RELAY_PID/status" 2>/dev/null)
  MCPU[$name]=$(cat "$dir"/w*.out | awk '$1 == "cpu" {s += $2} END {printf "%.2f", s}')
  RCPU[$name]=$(awk -v a="$c0" -v b="$c1" 'BEGIN {printf "%.2f", b - a}')
  RGBIT[$name]=$(awk -v a="${b0[0]}" -v b="${b1[0]}" 'BEGIN {printf "%.3f", (b - a) * 8 / 1e9}')
  RGBIT_IN[$name]=$(awk -v a="${b0[1]}" -v b="${b1[1]}" 'BEGIN {printf "%.3f", (b - a) * 8 / 1e9}')
  local barrier
  barrier=$(cat "$dir"/w*.out | awk '$1 == "barrier" {if ($2 > m) m = $2; if ($3 != "ok") e++}
    END {printf "final barrier %.2f s%s", m, (e ? ", " e " failed" : "")}')
  say "$name: ${OK[$name]} ok in $wall s ($barrier); per operation (s): $(printf '%s ' "${times[@]}");" \
    "relay ${RCPU[$name]} CPU s, sent ${RGBIT[$name]} Gbit, received ${RGBIT_IN[$name]} Gbit;" \
    "tbf dropped ${DROPS[$name]} packets (${RDROPS[$name]} at the relay's link);" \
    "members ${MCPU[$name]} CPU s; the machine (every process, others' too) ${BUSY[$name]} cores busy"
}

PUB=("${TAG}h1 $BASE.11" "${TAG}h2 $BASE.12" "${TAG}h3 $BASE.13" "${TAG}h4 $BASE.14")
for topo in $TOPOLOGIES; do
  case "$topo" in
    tcp)
      BOUND[$topo]=$BOUND_LINK
      run_topology tcp "${PUB[@]}" ;;
    direct)
      BOUND[$topo]=$BOUND_LINK
      run_topology direct "${PUB[@]}" ;;
    mixed)  # ranks: w1 w2 public, w3 in site 1, w4 in site 2
      BOUND[$topo]=$BOUND_LINK
      run_topology mixed "${PUB[0]}" "${PUB[1]}" "${TAG}n11 nat" "${TAG}n21 nat" ;;
    relayed)
      BOUND[$topo]=$BOUND_RELAY
      run_topology relayed "${TAG}n11 nat" "${TAG}n12 nat" "${TAG}n21 nat" "${TAG}n22 nat" ;;
    unshaped)
      for d in "${SHAPED[@]}"; do
        read -r ns dev <<<"$d"
        ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
      done
      SHAPED=()
      say "unshaped: every tbf removed"
      BOUND[$topo]=-
      run_topology unshaped "${TAG}n11 nat" "${TAG}n12 nat" "${TAG}n21 nat" "${TAG}n22 nat" ;;
    *) die "unknown topology $topo" ;;
  esac
done

echo
echo "K = $K, $FLOATS floats fp32 (E = $E B), $OPS operations each, links ${RATE_MBIT} Mbit/s (tbf burst $BURST)"
echo "bounds: direct/mixed 2(K-1)/K·E on each member's link = $BOUND_LINK s; relayed 2(K-1)·E out of the relay's link = $BOUND_RELAY s"
printf '%-9s %-34s %6s %9s %9s %9s %8s %7s\n' topology members ok "median s" "min s" "max s" "bound s" ratio
for topo in $TOPOLOGIES; do
  case "$topo" in
    tcp) who="4 public, raw TCP, no collective" ;;
    direct) who="4 public" ;;
    mixed) who="2 public + 2 NAT (1 per site)" ;;
    relayed) who="4 NAT (2 sites × 2), via relay" ;;
    unshaped) who="4 NAT via relay, no tbf" ;;
  esac
  ratio=-
  [ "${BOUND[$topo]}" != - ] && [ "${MED[$topo]}" != - ] &&
    ratio=$(awk -v m="${MED[$topo]}" -v b="${BOUND[$topo]}" 'BEGIN {printf "%.2f", m / b}')
  printf '%-9s %-34s %6s %9s %9s %9s %8s %7s\n' "$topo" "$who" "${OK[$topo]}" "${MED[$topo]}" \
    "${MIN[$topo]:--}" "${MAX[$topo]:--}" "${BOUND[$topo]}" "$ratio"
done
echo
echo "the relay (loco relay, CURVE, members' payloads sealed end to end), per topology:"
printf '%-9s %8s %10s %10s %11s %12s %13s %8s %14s %14s\n' topology "CPU s" "Gbit out" "Gbit in" "Gbit/s out" "relay cores" "CPU s / Gbit" "peak MB" "members cores" "machine cores"
for topo in $TOPOLOGIES; do
  # Gbit/s and cores over the operations' time (the sum of their times: they run back to back).
  awk -v t="$topo" -v c="${RCPU[$topo]}" -v g="${RGBIT[$topo]}" -v gi="${RGBIT_IN[$topo]}" \
    -v s="${RSUM[$topo]}" -v m="${BUSY[$topo]}" -v mc="${MCPU[$topo]}" -v h="${RHWM[$topo]:--}" 'BEGIN {
      printf "%-9s %8.2f %10.3f %10.3f %11s %12s %13s %8s %14s %14.2f\n", t, c, g, gi,
        (s > 0 ? sprintf("%.3f", g / s) : "-"), (s > 0 ? sprintf("%.2f", c / s) : "-"),
        (g > 0.01 ? sprintf("%.2f", c / g) : "-"), h, (s > 0 ? sprintf("%.2f", mc / s) : "-"), m }'
done
echo "(Gbit/s out, relay cores and members cores (the 4 members' CPU, whole process): over the sum of"
echo " the operations' times; CPU s / Gbit: the relay's core-seconds per Gbit its host sent, i.e. cores"
echo " per Gbit/s; peak MB: the relay's VmHWM after the topology (since it started); machine cores:"
echo " every process on the machine, other users' too, over the whole run)"
# The relay's own count of what it forwarded and dropped (it prints them when stopped).
kill -TERM "$RELAY_PID" 2>/dev/null
for _ in $(seq 1 50); do kill -0 "$RELAY_PID" 2>/dev/null || break; sleep 0.1; done
echo "$(grep 'relay: stopping' "$WORK/relay.log" || echo 'relay: did not report') ;" \
  "$(grep -c 'dropped a message' "$WORK/relay.log") drop warnings in its log"
fail=0
for topo in $TOPOLOGIES; do [ "${OK[$topo]}" = "$OPS/$OPS" ] || fail=1; done
exit $fail
