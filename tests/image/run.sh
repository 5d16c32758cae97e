#!/usr/bin/env bash
# `make test-image`: builds the image with Podman and smoke-tests it as the DaemonSet runs it
# (tests/image/). Needs root (Podman's storage, network namespaces); without root it says so and
# exits 0. What it installs when missing, from Debian: podman, runc, mmdebstrap, iproute2, nftables,
# iptables (to read the rulesets it must leave alone) and the CNI reference plugins.
#
# The base image is Debian bookworm with python3 and its venv module, made here with mmdebstrap
# (no container registry needed) and imported into Podman's own storage under a tag naming its
# recipe: it is kept between runs and built again only when the recipe below changes. Everything
# else the run makes (the project images and their layer cache, containers, a network namespace)
# it removes, and it checks that the machine's own network namespace did not change.
#
# Usage: tests/image/run.sh [pytest arguments]     (after `make check` or `make test` made .venv)
set -euo pipefail
cd "$(dirname "$0")/../.."

if [[ $(id -u) -ne 0 ]]; then
    echo "test-image: not root: the image smoke test is skipped (it runs Podman as root)" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg-query >/dev/null; then
    echo "test-image: no apt here: install podman, runc, mmdebstrap, iproute2, nftables and" \
        "the CNI plugins by hand" >&2
    exit 1
fi

PACKAGES=(podman runc mmdebstrap iproute2 nftables iptables containernetworking-plugins)
missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null | grep -qx installed; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]})); then
    echo "test-image: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The base image's recipe; its hash names the cached image.
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv
RECIPE=(
    --variant=apt --include="$BASE_PACKAGES" --format=tar
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias'
)
recipe_id=$(printf '%s\n' "$SUITE" "${RECIPE[@]}" | sha256sum | cut -c1-12)
BASE_IMAGE=localhost/ipamd-test-base:$SUITE-python3-$recipe_id
if podman image exists "$BASE_IMAGE"; then
    echo "test-image: base image $BASE_IMAGE (cached)"
else
    echo "test-image: building the base image $BASE_IMAGE with mmdebstrap"
    started=$SECONDS
    tarball=$(mktemp --suffix=.tar)
    trap 'rm -f "$tarball"' EXIT
    mmdebstrap --quiet "${RECIPE[@]}" "$SUITE" "$tarball"
    podman import --quiet --change 'CMD ["/bin/bash"]' "$tarball" "$BASE_IMAGE" >/dev/null
    rm -f "$tarball"
    echo "test-image: base image built in $((SECONDS - started)) s"
fi

export IPAMD_TEST_IMAGE=1 IPAMD_TEST_IMAGE_BASE=$BASE_IMAGE
# The builds run in the first test's set-up: a test's time limit is the build's, not pyproject's.
exec .venv/bin/python -m pytest tests/image -p no:cacheprovider --timeout=1800 "$@"
