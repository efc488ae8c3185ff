#!/usr/bin/env bash
# The all-reduce alone over slow links, with its default settings (512 KiB chunks, 3 s peer
# timeout): 4 hosts (network namespaces) whose egress is shaped to 20 Mbit/s by tc tbf, one
# collective_member process each, 6 all-reduces of 12 MB in a row. The shaper drops packets
# and TCP stalls a stream for seconds while it recovers, which is normal on real links: no
# live member may be taken for lost. Passes when every member reports every operation "ok"
# with the same hash as the others, and nothing failed. RATE, OPS and FLOATS change the
# setting (ctest's netns_collective_4mbit: RATE=4mbit OPS=3 FLOATS=1000000).
# Needs root; skipped (exit 77) otherwise.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/env.sh"
source "$LOCO_ROOT/tests/support/netns.sh"
LOCO_BIN="${LOCO_BIN:-$LOCO_BUILD/bin}"
RATE="${RATE:-20mbit}"
OPS="${OPS:-6}"
FLOATS="${FLOATS:-3000000}"
t0=$SECONDS
say() { echo "collective_slow_links: [$((SECONDS - t0)) s] $*"; }
[ "$(id -u)" = 0 ] || { echo "SKIPPED: not root"; exit 77; }
command -v ip >/dev/null && ip netns list >/dev/null 2>&1 || { echo "SKIPPED: no netns"; exit 77; }

TAG="cs$$"
BR="${TAG}br"
BASE="10.$((100 + $$ % 100)).$(( ($$ / 100 + 7) % 250 ))"
WORK="$(mktemp -d /tmp/loco-collective-netns-XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  netns_teardown "$BR" "${TAG}h1" "${TAG}h2" "${TAG}h3" "${TAG}h4"
  [ -z "${LOCO_KEEP_LOGS:-}" ] && rm -rf "$WORK"
  true
}
trap cleanup EXIT

netns_bridge "$BR"
for h in 1 2 3 4; do
  netns_host "$BR" "${TAG}h$h" "${TAG}v$h" "${TAG}p$h" "$BASE.1$h/24"
  ip netns exec "${TAG}h$h" tc qdisc add dev "${TAG}p$h" root tbf rate "$RATE" burst 32kbit latency 400ms
done
say "4 hosts on $BASE.0/24, egress $RATE each; $OPS all-reduces of $FLOATS floats, default settings"
peers=()
for h in 1 2 3 4; do peers+=("w$h=tcp://$BASE.1$h:7300"); done
for h in 1 2 3 4; do
  LOCO_MEMBER_BIND="tcp://$BASE.1$h:7300" ip netns exec "${TAG}h$h" \
    "$LOCO_BIN/collective_member" "w$h" "$h" 100 "$FLOATS" 5 fp32 3000 524288 "repeat:$OPS" \
    "${peers[@]}" >"$WORK/w$h.out" 2>"$WORK/w$h.err" &
  PIDS+=($!)
done
# Bounded: each member ends by itself (every wait inside an operation is bounded); 300 s is
# ten times what the operations take at this rate.
deadline=$((SECONDS + 300))
for p in "${PIDS[@]}"; do
  while kill -0 "$p" 2>/dev/null; do
    ((SECONDS < deadline)) || { say "FAILED: members still running after 300 s"; exit 1; }
    sleep 1
  done
done
status=0
for h in 1 2 3 4; do
  say "w$h: $(grep -c '^ok ' "$WORK/w$h.out" || true) ok, $(grep -c '^error ' "$WORK/w$h.out" || true) failed"
  grep '^error ' "$WORK/w$h.out" | head -3 | sed 's/^/    /' || true
done
for i in $(seq 1 "$OPS"); do
  lines=$(for h in 1 2 3 4; do grep -E '^(ok|error) ' "$WORK/w$h.out" | sed -n "${i}p"; done | sort -u)
  if [ "$(echo "$lines" | wc -l)" != 1 ] || [ "${lines#ok }" = "$lines" ]; then
    say "operation $i: members disagree or failed:"
    echo "$lines" | sed 's/^/    /'
    status=1
  fi
done
[ $status = 0 ] && say "PASSED: $OPS operations, every member ok with the same hash"
exit $status
