#!/usr/bin/env bash
# The all-reduce on shaped links: K network namespaces (10.77.0.1..K) on a Linux bridge, each
# host's egress limited by a token bucket (tc tbf; netem is not available on these kernels, so
# the links get a bandwidth but no added delay). Runs Gloo's ring and ours in every codec,
# then tears everything down, also on failure or Ctrl-C. Needs root.
#
#   bench/allreduce/netns.sh                     # K=4, 1gbit, 128 MB, fp32,fp16,int8
#   K=2 RATE=500mbit SIZES=16,128 CODECS=fp32 bench/allreduce/netns.sh
#   SLOW=250mbit CODECS=fp32 bench/allreduce/netns.sh  # host 0 on a slower link; adds
#                                                      # ours-auto (parts sized by bandwidth)
set -euo pipefail
K=${K:-4}
RATE=${RATE:-1gbit}
SLOW=${SLOW:-}
IMPLS=${IMPLS:-gloo,ours${SLOW:+,ours-auto}}
SIZES=${SIZES:-128}
CODECS=${CODECS:-fp32,fp16,int8}
ITERS=${ITERS:-3}
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../../tests/support/netns.sh"
BENCH=${BENCH:-$here/../../build/bin/allreduce_bench}
P=locoar        # namespaces locoar0..
BR=locoarbr0
NET=10.77.0

case "$RATE" in
  *gbit) GBIT=${RATE%gbit} ;;
  *mbit) GBIT=$(awk "BEGIN{print ${RATE%mbit}/1000}") ;;
  *) echo "RATE must end in gbit or mbit" >&2; exit 2 ;;
esac

cleanup() {
  netns_teardown "$BR" $(for i in $(seq 0 $((K - 1))); do echo "$P$i"; done)
}
trap cleanup EXIT INT TERM
cleanup

netns_bridge "$BR"
ips=()
for i in $(seq 0 $((K - 1))); do
  ns="$P$i"
  netns_host "$BR" "$ns" "${P}h$i" "${P}n$i" "$NET.$((i + 1))/24"
  # The host's egress: rate-limited, with a bucket of ~4 ms at 1 Gbit/s.
  rate=$RATE
  if [ "$i" = 0 ] && [ -n "$SLOW" ]; then rate=$SLOW; fi
  tc -n "$ns" qdisc add dev "${P}n$i" root tbf rate "$rate" burst 512kb latency 100ms
  ips+=("$NET.$((i + 1))")
done
echo "# $K namespaces on bridge $BR, egress tbf rate $RATE per host${SLOW:+ ($SLOW for host 0)}"
tc -n "${P}0" qdisc show dev "${P}n0"

IFS=,; iplist="${ips[*]}"; unset IFS
# vs_link only where every link has the same rate (the bound is then that rate).
link=$GBIT
if [ -n "$SLOW" ]; then link=0; fi
"$BENCH" --procs "$K" --sizes-mb "$SIZES" --impls "$IMPLS" --codecs "$CODECS" \
  --netns "$P" --ips "$iplist" --link-gbit "$link" --iters "$ITERS"
