# Hosts as network namespaces on a Linux bridge, for tests and benchmarks that
# need separate hosts on one machine (sourced; needs root and iproute2).
#
#   netns_bridge BR [ADDR/PREFIX]          the bridge, up, with an address if given
#   netns_host BR NS VETH_BR VETH_NS ADDR/PREFIX
#                                          namespace NS joined to BR by a veth pair
#                                          (VETH_BR on the bridge, VETH_NS inside, up)
#   netns_teardown BR NS...                removes them again (errors ignored)
#
# Links are left unshaped: callers add their tc qdiscs.

netns_bridge() {
  ip link add "$1" type bridge
  if [ -n "${2:-}" ]; then ip addr add "$2" dev "$1"; fi
  ip link set "$1" up
  # dockerd sets iptables' FORWARD policy to DROP; the bridge's hosts must reach each other.
  iptables -I FORWARD -i "$1" -o "$1" -j ACCEPT 2>/dev/null || true
}

netns_host() {
  local br="$1" ns="$2" vbr="$3" vns="$4" addr="$5"
  ip netns add "$ns"
  ip link add "$vbr" type veth peer name "$vns"
  ip link set "$vns" netns "$ns"
  ip link set "$vbr" master "$br" up
  ip -n "$ns" addr add "$addr" dev "$vns"
  ip -n "$ns" link set "$vns" up
  ip -n "$ns" link set lo up
}

netns_teardown() {
  local br="$1"
  shift
  for ns in "$@"; do ip netns del "$ns" 2>/dev/null || true; done
  ip link del "$br" 2>/dev/null || true
  iptables -D FORWARD -i "$br" -o "$br" -j ACCEPT 2>/dev/null || true
}
