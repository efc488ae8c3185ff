# Sites behind NAT routers, as network namespaces, for the tests and benchmarks of hosts that
# accept no inbound connection (sourced after netns.sh; needs root, iproute2 and iptables).
#
#   nat_site PUB_BR S WAN_ADDR/PREFIX      site S: a router namespace TAG"r"S with its WAN side
#                                          on the public bridge PUB_BR at WAN_ADDR, its LAN side
#                                          192.168.S.1/24 on a bridge of the site's own; the
#                                          router masquerades what leaves on the WAN and lets in
#                                          only replies (conntrack ESTABLISHED): nothing is
#                                          forwarded in
#   nat_host S NS I                        namespace NS in site S at 192.168.S.(10 + I), its
#                                          default route through the router
#   nat_teardown S...                      removes the sites' routers and bridges
#
# Names are TAG-prefixed (TAG is the caller's); interface names stay within 15 characters.
# Hosts are removed by the caller (netns_teardown), routers and site bridges here.

nat_site() {
  local pub="$1" s="$2" wan="$3" r="${TAG}r$2" lan_br="${TAG}s$2"
  ip link add "$lan_br" type bridge
  ip link set "$lan_br" up
  iptables -I FORWARD -i "$lan_br" -o "$lan_br" -j ACCEPT 2>/dev/null || true
  ip netns add "$r"
  ip link add "${TAG}w$s" type veth peer name "${TAG}W$s"
  ip link set "${TAG}W$s" netns "$r"
  ip link set "${TAG}w$s" master "$pub" up
  ip -n "$r" link set "${TAG}W$s" name wan
  ip -n "$r" addr add "$wan" dev wan
  ip -n "$r" link set wan up
  ip link add "${TAG}l$s" type veth peer name "${TAG}L$s"
  ip link set "${TAG}L$s" netns "$r"
  ip link set "${TAG}l$s" master "$lan_br" up
  ip -n "$r" link set "${TAG}L$s" name lan
  ip -n "$r" addr add "192.168.$s.1/24" dev lan
  ip -n "$r" link set lan up
  ip -n "$r" link set lo up
  ip netns exec "$r" sysctl -qw net.ipv4.ip_forward=1
  ip netns exec "$r" iptables -t nat -A POSTROUTING -o wan -j MASQUERADE
  ip netns exec "$r" iptables -A FORWARD -i wan -o lan -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
  ip netns exec "$r" iptables -A FORWARD -i wan -o lan -j DROP
}

nat_host() {
  local s="$1" ns="$2" i="$3"
  netns_host "${TAG}s$s" "$ns" "${TAG}v$s$i" "${TAG}p$s$i" "192.168.$s.$((10 + i))/24"
  ip -n "$ns" route add default via "192.168.$s.1"
}

nat_teardown() {
  for s in "$@"; do
    ip netns del "${TAG}r$s" 2>/dev/null || true
    ip link del "${TAG}s$s" 2>/dev/null || true
    iptables -D FORWARD -i "${TAG}s$s" -o "${TAG}s$s" -j ACCEPT 2>/dev/null || true
  done
}
