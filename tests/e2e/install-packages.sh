#!/usr/bin/env bash
# Installs what the end-to-end tests need when it is missing: a real containerd, runc, Debian's CNI
# plugins, iproute2, nftables, iptables (aws-node's SNAT chains in the takeover test), ping and sysctl
# (the emulated VPC of bench/vpc) and a C compiler for the pause image. Needs root (apt); without
# root it says so and the end-to-end tests that need root skip. Safe to run again: it installs only
# what is missing.
set -euo pipefail

PACKAGES=(containerd runc containernetworking-plugins iproute2 nftables iptables iputils-ping procps gcc libc6-dev)

if [[ $(id -u) -ne 0 ]]; then
    echo "not root: the end-to-end tests that need root are skipped" >&2
    exit 0
fi
if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
    echo "no apt here: install ${PACKAGES[*]} by hand for the end-to-end tests" >&2
    exit 0
fi
missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null | grep -qx installed; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]})); then
    echo "installing for the end-to-end tests: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
