#!/bin/sh
# Installs ipamd's CNI plugin into the node's CNI bin directory; the DaemonSet's init container runs
# it on every start of the pod. It installs ipamd-cni, and the reference plugins the image ships
# (portmap, for hostPort) where the node lacks them: a node's own copy is never replaced. The
# conflist is written by the ipamd container once the daemon is ready (a conflist tells kubelet the
# node's network is ready).
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
#   IPAMD_CNI_PLUGINS           reference plugins the image ships          (/opt/ipamd/cni/plugins)
#   IPAMD_CNI_REQUIRED_PLUGINS  plugins the conflist needs from the node  ("loopback portmap")
#   ENABLE_IPv6                 "true": host-local is needed too (IPv6 pods' IPv4 egress addresses)
set -eu

bin_dir=${IPAMD_CNI_BIN_DIR:-/host/opt/cni/bin}
bundle=${IPAMD_CNI_BUNDLE:-/opt/ipamd/cni/bundle}
launcher=${IPAMD_CNI_LAUNCHER:-/opt/ipamd/cni/ipamd-cni}
plugins=${IPAMD_CNI_PLUGINS:-/opt/ipamd/cni/plugins}
required=${IPAMD_CNI_REQUIRED_PLUGINS-loopback portmap}
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
# ipamd-cni makes the pod's interface itself, but the runtime brings up lo with loopback, and the
# conflist chains portmap for hostPort: without them every pod's ADD would fail on this node. Fail
# here instead, where the message is plain, before anything is written. A plugin the image ships
# counts: it is installed below.
for plugin in $required; do
    [ -x "$bin_dir/$plugin" ] || [ -x "$plugins/$plugin" ] ||
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

# 3. The reference plugins the image ships, where the node has none of that name (by rename, so a
#    runtime never runs half a file).
if [ -d "$plugins" ]; then
    for shipped in "$plugins"/*; do
        [ -x "$shipped" ] || continue
        name=${shipped##*/}
        [ -e "$bin_dir/$name" ] && continue
        cp "$shipped" "$bin_dir/.$name.tmp"
        chmod 0755 "$bin_dir/.$name.tmp"
        mv -f "$bin_dir/.$name.tmp" "$bin_dir/$name"
        say "$name installed from the image (the node had none)"
    done
fi

# A runtime whose libcni reads the conflist's `cniVersions` (libcni 1.2 and newer) calls every
# plugin with the highest version it knows, 1.1.0 today: a portmap older than plugins v1.5 refuses
# it, and every ADD on the node would fail. Said here, where an operator looks first.
if [ -x "$bin_dir/portmap" ]; then
    versions=$(CNI_COMMAND=VERSION "$bin_dir/portmap" </dev/null 2>/dev/null || true)
    case $versions in
    *'"1.1.0"'*) ;;
    *) say "warning: $bin_dir/portmap does not support CNI 1.1.0 ($versions): with a runtime that" \
        "picks 1.1.0 (containerd 2), install containernetworking plugins v1.5 or newer" ;;
    esac
fi

# 4. The launcher, last: on a first install it appears only once its runtime is in place.
cp "$launcher" "$bin_dir/.ipamd-cni.tmp"
chmod 0755 "$bin_dir/.ipamd-cni.tmp"
mv -f "$bin_dir/.ipamd-cni.tmp" "$bin_dir/ipamd-cni"

# 5. The installed plugin answers VERSION the way the node's runtime will run it.
answer=$(CNI_COMMAND=VERSION "$bin_dir/ipamd-cni" </dev/null) ||
    die "the installed ipamd-cni does not run: $answer"
case $answer in
*supportedVersions*) ;;
*) die "the installed ipamd-cni answered VERSION with: $answer" ;;
esac

# 6. Runtimes other than this one and the previous one go.
for dir in "$store"/*; do
    name=${dir##*/}
    case $name in
    current | "$id" | "$previous") ;;
    *) [ -d "$dir" ] && rm -rf "$dir" && say "runtime $name removed" ;;
    esac
done

say "ipamd-cni installed in $bin_dir (runtime $id${previous:+, previous $previous})"
