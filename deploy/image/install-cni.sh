#!/bin/sh
# Installs ipamd's CNI plugin into the node's CNI bin directory; the DaemonSet's init container runs
# it on every start of the pod. It installs only ipamd-cni: the conflist is written by the ipamd
# container once the daemon is ready (a conflist tells kubelet the node's network is ready).
#
# What it leaves in the bin directory (see cni-launcher.c):
#   ipamd-cni                 the launcher, a static executable
#   ipamd-cni.d/<id>/         the plugin's private runtime, named by its content hash, never edited
#   ipamd-cni.d/current       symlink to the runtime in use
#
# Every step replaces by rename, so a runtime executing the plugin meanwhile sees the old install or
# the new one, never half of one: the runtime is copied under a temporary name then renamed, the
# `current` link and the launcher are replaced by rename. The runtime the previous install used is
# kept (a plugin started just before the switch may still be reading it); older ones are removed.
#
# Environment (defaults are the image's paths and the DaemonSet's mount):
#   IPAMD_CNI_BIN_DIR           the node's CNI bin directory as mounted   (/host/opt/cni/bin)
#   IPAMD_CNI_BUNDLE            the runtime in the image                  (/opt/ipamd/cni/bundle)
#   IPAMD_CNI_LAUNCHER          the launcher in the image                 (/opt/ipamd/cni/ipamd-cni)
#   IPAMD_CNI_REQUIRED_PLUGINS  plugins the conflist needs from the node  ("loopback")
#   ENABLE_IPv6                 "true": host-local is needed too (IPv6 pods' IPv4 egress addresses)
set -eu

bin_dir=${IPAMD_CNI_BIN_DIR:-/host/opt/cni/bin}
bundle=${IPAMD_CNI_BUNDLE:-/opt/ipamd/cni/bundle}
launcher=${IPAMD_CNI_LAUNCHER:-/opt/ipamd/cni/ipamd-cni}
required=${IPAMD_CNI_REQUIRED_PLUGINS-loopback}
if [ "${ENABLE_IPv6:-false}" = "true" ]; then
    required="$required host-local"
fi

say() { echo "install-cni: $*" >&2; }
die() {
    say "$*"
    exit 1
}

[ -d "$bin_dir" ] || die "$bin_dir is not a directory: mount the node's CNI bin directory there"
[ -r "$bundle/ID" ] || die "$bundle/ID is missing: the image was not built by its Dockerfile"
[ -x "$launcher" ] || die "$launcher is missing or not executable"
# ipamd-cni makes the pod's interface itself, but the runtime brings up lo with loopback: without it
# every pod's ADD would fail on this node. Fail here instead, where the message is plain.
for plugin in $required; do
    [ -x "$bin_dir/$plugin" ] ||
        die "$bin_dir/$plugin is missing: install the CNI reference plugins on the node first"
done

id=$(cat "$bundle/ID")
store="$bin_dir/ipamd-cni.d"
mkdir -p "$store"

# 1. The runtime, under its content ID. A directory of that name is complete (it only ever appears
#    by rename); a leftover temporary copy from an interrupted install is removed.
if [ ! -d "$store/$id" ]; then
    rm -rf "$store/.$id.tmp"
    cp -R "$bundle" "$store/.$id.tmp"
    mv "$store/.$id.tmp" "$store/$id"
    say "runtime $id copied"
fi

# 2. `current` points at it: a new symlink renamed over the old one (mv -T: never into the target).
previous=$(readlink "$store/current" 2>/dev/null || true)
ln -sfn "$id" "$store/.current.tmp"
mv -Tf "$store/.current.tmp" "$store/current"

# 3. The launcher, last: on a first install it appears only once its runtime is in place.
cp "$launcher" "$bin_dir/.ipamd-cni.tmp"
chmod 0755 "$bin_dir/.ipamd-cni.tmp"
mv -f "$bin_dir/.ipamd-cni.tmp" "$bin_dir/ipamd-cni"

# 4. The installed plugin answers VERSION the way the node's runtime will run it.
answer=$(CNI_COMMAND=VERSION "$bin_dir/ipamd-cni" </dev/null) ||
    die "the installed ipamd-cni does not run: $answer"
case $answer in
*supportedVersions*) ;;
*) die "the installed ipamd-cni answered VERSION with: $answer" ;;
esac

# 5. Runtimes other than this one and the previous one go.
for dir in "$store"/*; do
    name=${dir##*/}
    case $name in
    current | "$id" | "$previous") ;;
    *) [ -d "$dir" ] && rm -rf "$dir" && say "runtime $name removed" ;;
    esac
done

say "ipamd-cni installed in $bin_dir (runtime $id${previous:+, previous $previous})"
