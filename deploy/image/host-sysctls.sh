#!/bin/sh
# The node settings host networking needs that only a privileged container can write (/proc/sys is
# read-only in any other): loose reverse-path filtering (rp_filter=2) on the primary interface, as
# VPC CNI's init container sets it. A reply to a pod on a secondary ENI may arrive on the primary
# interface (SNATed traffic, NodePort), and strict filtering would drop it there. Run by the
# DaemonSet's `host-sysctls` init container; the primary interface is the one of the default route
# unless IPAMD_PRIMARY_INTERFACE names it.
#
# In IPv6 mode (ENABLE_IPv6=true, from the ConfigMap) the node also forwards its pods' IPv6 traffic,
# and keeps the default route it learns from the VPC router's advertisements while it forwards
# (accept_ra=2 on the primary interface: with the default 1, a forwarding host ignores them). The
# VPC CNI's init container sets the same two; accept_ra goes first, so the route is never dropped.
set -eu

iface=${IPAMD_PRIMARY_INTERFACE:-}
if [ -z "$iface" ]; then
    # /proc/net/route: Iface Destination Gateway ...; the default route's destination is 00000000.
    while read -r name destination _; do
        if [ "$destination" = "00000000" ]; then
            iface=$name
            break
        fi
    done < /proc/net/route
fi
if [ -z "$iface" ]; then
    echo "host-sysctls: the node has no default route: cannot tell its primary interface" >&2
    exit 1
fi
knob="/proc/sys/net/ipv4/conf/$iface/rp_filter"
if [ ! -e "$knob" ]; then
    echo "host-sysctls: no interface $iface on this node" >&2
    exit 1
fi
echo 2 > "$knob"
echo "host-sysctls: net.ipv4.conf.$iface.rp_filter=2"
if [ "${ENABLE_IPv6:-false}" = "true" ]; then
    echo 2 > "/proc/sys/net/ipv6/conf/$iface/accept_ra"
    echo 1 > /proc/sys/net/ipv6/conf/all/forwarding
    echo "host-sysctls: net.ipv6.conf.$iface.accept_ra=2 net.ipv6.conf.all.forwarding=1"
fi
