#!/bin/bash
# Records the real command output the parsers in skh/collect/ are tested on. Run as root on a
# machine with Open vSwitch (userspace datapath; no kernel module needed) and iproute2:
#   tests/collect/data/record.sh [OUTDIR]
# Everything it builds lives in namespaces named skhl-* and under a private run directory; it is
# all torn down on exit, even on failure.
set -euo pipefail
OUT=$(realpath "${1:-$(dirname "$0")}")
RUN=$(mktemp -d /tmp/skhl-ovs.XXXXXX)
NS="skhl-oa skhl-ob skhl-oca skhl-ocb skhl-la skhl-lb skhl-lca skhl-h1 skhl-r1 skhl-r2 skhl-h2"
cleanup() {
  set +e
  for h in a b; do for p in ovs-vswitchd ovsdb-server; do
    [ -f "$RUN/$h/$p.pid" ] && kill "$(cat "$RUN/$h/$p.pid")" 2>/dev/null; done; done
  sleep 0.3
  for ns in $NS; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$RUN"
}
trap cleanup EXIT
for ns in $NS; do ip netns add "$ns"; ip -n "$ns" link set lo up; done

# --- 1. Two OVS hosts (userspace datapath), VXLAN between them, one container each ------------
start_ovs() {
  local h=$1 d=$RUN/$1; mkdir -p "$d"
  ovsdb-tool create "$d/conf.db" /usr/share/openvswitch/vswitch.ovsschema
  ip netns exec "skhl-o$h" ovsdb-server "$d/conf.db" --remote="punix:$d/db.sock" --pidfile="$d/ovsdb-server.pid" \
     --detach --log-file="$d/ovsdb-server.log" --unixctl="$d/ovsdb-server.ctl"
  ovs-vsctl --db="unix:$d/db.sock" --no-wait init
  OVS_RUNDIR=$d ip netns exec "skhl-o$h" ovs-vswitchd "unix:$d/db.sock" --pidfile="$d/ovs-vswitchd.pid" --detach \
     --log-file="$d/ovs-vswitchd.log" --unixctl="$d/ovs-vswitchd.ctl"
}
vs() { ovs-vsctl --db="unix:$RUN/$1/db.sock" "${@:2}"; }
ofctl() { ovs-ofctl "$2" "unix:$RUN/$1/$3.mgmt" "${@:4}"; }
ip link add u0 netns skhl-oa type veth peer name u0 netns skhl-ob
for h in a b; do
  start_ovs $h
  [ $h = a ] && n=1 || n=2
  vs $h add-br br-phy -- set bridge br-phy datapath_type=netdev
  ip netns exec skhl-o$h ethtool -K u0 tx off >/dev/null
  ip -n skhl-o$h link set u0 up
  vs $h add-port br-phy u0
  ip -n skhl-o$h addr add 10.99.0.$n/24 dev br-phy; ip -n skhl-o$h link set br-phy up
  vs $h add-br br-int -- set bridge br-int datapath_type=netdev
  vs $h add-port br-int vx0 -- set interface vx0 type=vxlan options:remote_ip=10.99.0.$((3-n)) \
     options:key=1000 options:local_ip=10.99.0.$n
  ip link add eth0 netns skhl-oc$h type veth peer name rep0 netns skhl-o$h
  ip -n skhl-o$h link set rep0 up; vs $h add-port br-int rep0
  ip -n skhl-oc$h addr add 192.168.88.$n/24 dev eth0; ip -n skhl-oc$h link set eth0 up
  ip netns exec skhl-oc$h ethtool -K eth0 tx off >/dev/null
done
# explicit OpenFlow rules on host a, as a controller would program them (plus the default NORMAL)
ofctl a add-flow br-int "table=0,priority=100,in_port=rep0,ip,nw_dst=192.168.88.2,actions=output:vx0"
ofctl a add-flow br-int "table=0,priority=100,in_port=vx0,ip,nw_dst=192.168.88.1,actions=output:rep0"
ofctl a add-flow br-int "table=0,priority=50,arp,actions=NORMAL"
ofctl a add-flow br-int "table=0,priority=200,ip,nw_dst=192.168.88.9,actions=drop"
sleep 1
ip netns exec skhl-oca ping -c 3 -i 0.2 -W 1 192.168.88.2 >/dev/null
ip netns exec skhl-oca ping -c 2 -i 0.2 -W 1 192.168.88.9 >/dev/null || true   # hits the drop rule
ofctl a dump-flows br-int > "$OUT/ovs-ofctl-dump-flows.txt"
ofctl a dump-flows br-int --names > "$OUT/ovs-ofctl-dump-flows-names.txt"
ofctl b dump-flows br-int > "$OUT/ovs-ofctl-dump-flows-normal.txt"
ofctl a show br-int > "$OUT/ovs-ofctl-show.txt"
ovs-appctl -t "$RUN/a/ovs-vswitchd.ctl" dpctl/dump-flows > "$OUT/ovs-dpctl-dump-flows.txt"
ovs-appctl -t "$RUN/a/ovs-vswitchd.ctl" dpctl/dump-flows -m > "$OUT/ovs-dpctl-dump-flows-m.txt"
ovs-appctl -t "$RUN/a/ovs-vswitchd.ctl" dpctl/show > "$OUT/ovs-dpctl-show.txt"
ovs-appctl -t "$RUN/a/ovs-vswitchd.ctl" dpif/dump-flows br-int > "$OUT/ovs-dpif-dump-flows.txt"
ovs-appctl -t "$RUN/b/ovs-vswitchd.ctl" dpctl/dump-flows > "$OUT/ovs-dpctl-dump-flows-b.txt"
# the slow-path case: datapath flows evicted while OpenFlow rules are in use (as when an RNIC
# drops offloaded flows it judged idle); dump right after, before traffic re-installs them
ip netns exec skhl-oca ping -c 3 -i 0.2 -W 1 192.168.88.2 >/dev/null
ovs-appctl -t "$RUN/a/ovs-vswitchd.ctl" dpctl/del-flows >/dev/null
ofctl a dump-flows br-int > "$OUT/ovs-ofctl-dump-flows-evicted.txt"
ovs-appctl -t "$RUN/a/ovs-vswitchd.ctl" dpctl/dump-flows > "$OUT/ovs-dpctl-dump-flows-evicted.txt"

# --- 2. Kernel VXLAN (the testbed's overlay): FDB, routes, neighbours ---------------------------
ip link add rnic0 netns skhl-la type veth peer name rnic0 netns skhl-lb
for h in a b; do
  [ $h = a ] && g=0 && o=1 || { g=1; o=0; }
  ip -n skhl-l$h addr add 10.0.0.$((g+1))/24 dev rnic0; ip -n skhl-l$h link set rnic0 up
  ip -n skhl-l$h link add vx0 type vxlan id 1000 local 10.0.0.$((g+1)) dev rnic0 dstport 4789 nolearning
  ip -n skhl-l$h link set vx0 address 02:00:00:00:00:0$g; ip -n skhl-l$h link set vx0 up
  ip -n skhl-l$h addr add 172.16.$g.0/32 dev vx0
  ip -n skhl-l$h route add 172.16.$o.0/24 via 172.16.$o.0 dev vx0 onlink
  ip -n skhl-l$h neigh add 172.16.$o.0 lladdr 02:00:00:00:00:0$o dev vx0 nud permanent
  bridge -n skhl-l$h fdb append 02:00:00:00:00:0$o dev vx0 dst 10.0.0.$((o+1))
done
ip link add vf0 netns skhl-lca type veth peer name c0v0 netns skhl-la
ip -n skhl-la link set c0v0 address ee:ee:ee:ee:ee:ee; ip -n skhl-la link set c0v0 up
ip -n skhl-la route add 172.16.0.1/32 dev c0v0
ip -n skhl-lca addr add 172.16.0.1/32 dev vf0; ip -n skhl-lca link set vf0 up
ip -n skhl-lca neigh add 169.254.1.1 lladdr ee:ee:ee:ee:ee:ee dev vf0 nud permanent
ip -n skhl-lca route add 172.16.0.0/16 via 169.254.1.1 dev vf0 onlink
bridge -n skhl-la -j fdb show > "$OUT/bridge-fdb-show.json"
bridge -n skhl-la fdb show > "$OUT/bridge-fdb-show.txt"
bridge -n skhl-la -j fdb show dev vx0 > "$OUT/bridge-fdb-show-vx0.json"
ip -n skhl-la -j route show table all > "$OUT/ip-route-all.json"
ip -n skhl-la -j route > "$OUT/ip-route.json"
ip -n skhl-la route > "$OUT/ip-route.txt"
ip -n skhl-lca -j route > "$OUT/ip-route-container.json"
ip -n skhl-la -j neigh > "$OUT/ip-neigh.json"
ip -n skhl-la -j -d link show > "$OUT/ip-link-detail.json"

# --- 2b. The kernel's offload view: tc filters (u32 here; flower is not built into this kernel)
ip -n skhl-la link add tca type veth peer name tcb
ip -n skhl-la link set tca up; ip -n skhl-la link set tcb up
tc -n skhl-la qdisc add dev tca clsact
tc -n skhl-la filter add dev tca ingress pref 1 protocol ip u32 match ip dst 172.16.1.1/32 action mirred egress redirect dev tcb
tc -n skhl-la filter add dev tca ingress pref 2 protocol ip u32 skip_hw match ip dst 172.16.1.0/24 action mirred egress redirect dev tcb
tc -n skhl-la filter show dev tca ingress > "$OUT/tc-filter-show.txt"
tc -n skhl-la -s -j filter show dev tca ingress > "$OUT/tc-filter-show.json"

# --- 3. A routed underlay h1 - r1 - r2 - h2 for traceroute ---------------------------------------
ip link add e0 netns skhl-h1 type veth peer name e0 netns skhl-r1
ip link add e1 netns skhl-r1 type veth peer name e0 netns skhl-r2
ip link add e1 netns skhl-r2 type veth peer name e0 netns skhl-h2
ip -n skhl-h1 addr add 10.9.1.1/24 dev e0; ip -n skhl-r1 addr add 10.9.1.254/24 dev e0
ip -n skhl-r1 addr add 10.9.12.0/31 dev e1; ip -n skhl-r2 addr add 10.9.12.1/31 dev e0
ip -n skhl-r2 addr add 10.9.2.254/24 dev e1; ip -n skhl-h2 addr add 10.9.2.1/24 dev e0
for ns in skhl-h1 skhl-r1 skhl-r2 skhl-h2; do for d in e0 e1; do ip -n $ns link set $d up 2>/dev/null || true; done; done
for r in skhl-r1 skhl-r2; do
  ip netns exec $r sysctl -qw net.ipv4.ip_forward=1 net.ipv4.icmp_ratelimit=0 net.ipv4.icmp_errors_use_inbound_ifaddr=1
done
ip -n skhl-h1 route add default via 10.9.1.254
ip -n skhl-h2 route add default via 10.9.2.254
ip -n skhl-r1 route add 10.9.2.0/24 via 10.9.12.1
ip -n skhl-r2 route add 10.9.1.0/24 via 10.9.12.0
ip netns exec skhl-h1 traceroute -n -U -q 3 -w 1 -m 8 10.9.2.1 > "$OUT/traceroute-ok.txt" 2>&1
# a black hole after r1: r1 loses its route, probes beyond it die silently
ip -n skhl-r1 route replace blackhole 10.9.2.0/24
ip netns exec skhl-h1 traceroute -n -U -q 3 -w 0.5 -m 5 10.9.2.1 > "$OUT/traceroute-blackhole.txt" 2>&1 || true
ip -n skhl-r1 route replace unreachable 10.9.2.0/24
# the kernel rate-limits unreachables per peer from its first one: warm that up first
ip netns exec skhl-h1 traceroute -n -U -q 1 -w 0.3 -m 2 10.9.2.1 >/dev/null 2>&1 || true; sleep 1.2
ip netns exec skhl-h1 traceroute -n -U -q 2 -w 0.5 -m 5 10.9.2.1 > "$OUT/traceroute-unreachable.txt" 2>&1 || true
ip -n skhl-r1 route replace 10.9.2.0/24 via 10.9.12.1
# a silent drop on r2's downstream port: r2 answers, h2 does not
ip -n skhl-h2 link set e0 down
ip netns exec skhl-h1 traceroute -n -U -q 2 -w 0.5 -m 5 10.9.2.1 > "$OUT/traceroute-silent.txt" 2>&1 || true
ip -n skhl-h2 link set e0 up; ip -n skhl-h2 route replace default via 10.9.2.254
# the flow-pinned trace of skh.collect (same recipe, our implementation)
PYTHONPATH="$(dirname "$0")/../../.." ip netns exec skhl-h1 "${PYTHON:-python3}" -m skh.collect.trace \
  --src 10.9.1.1 --dst 10.9.2.1 --sport 40002 --max-ttl 6 --timeout 0.5 > "$OUT/paris-trace.json" || true
echo "recorded into $OUT"
