# ipamd's image: the daemon (`ipamd run`), `ipamctl`, the DaemonSet's probe, and what its init
# container installs on the node (`ipamd-cni` with its own Python runtime). Build: `make image`
# (needs a container engine: Docker, Podman or BuildKit). deploy/ holds the manifests that run it.
# Nothing here names an architecture: `make image PLATFORM=linux/arm64` runs the same steps for arm64
# (the official python image is multi-platform, Debian's packages and paths are the same on both, and
# the plugin's runtime takes the loader and libraries ldd finds).
#
# Versions are pinned: the base image by tag (set PYTHON_IMAGE to `python:...@sha256:...` to pin it
# by digest in your build), Python packages by deploy/image/constraints.txt, Debian packages by the
# base image's Debian release. Any Debian-based image with python3 and its venv module will do as
# PYTHON_IMAGE (`make test-image` builds on Debian's own python3); the RUN steps call `python3`,
# which every such image has.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

# --- build: the virtualenv, the plugin's runtime and the launcher ---------------------------------
FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev containernetworking-plugins \
 && rm -rf /var/lib/apt/lists/*
# portmap (hostPort), chained after ipamd-cni in the conflist: install-cni puts it on a node that
# lacks it, as VPC CNI's image brings its own.
RUN mkdir -p /opt/ipamd/cni/plugins && cp /usr/lib/cni/portmap /opt/ipamd/cni/plugins/portmap
WORKDIR /src
# The dependencies first, from the pins alone: a change to ipamd's code reuses this layer. pip gets
# the builder's index and certificate bundle as build secrets when `make image` finds them
# (deploy/image/pip_build_secrets.py); they are mounted for this step only, never stored in a layer.
COPY deploy/image/constraints.txt deploy/image/build-system.txt deploy/image/
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=pip_cert \
    python3 -m venv /opt/ipamd/venv \
 && PIP_CONFIG_FILE=/run/secrets/pip_conf /opt/ipamd/venv/bin/pip install --no-cache-dir \
      --disable-pip-version-check --requirement deploy/image/constraints.txt \
      --requirement deploy/image/build-system.txt
# Then ipamd itself, offline: no index, no dependency, the build backend installed above; `pip check`
# fails the build if the pins no longer satisfy pyproject.toml's requirements.
COPY pyproject.toml README.md ./
COPY ipamd ./ipamd
COPY cloud ./cloud
COPY datastore ./datastore
RUN /opt/ipamd/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-index \
      --no-deps --no-build-isolation . \
 && /opt/ipamd/venv/bin/pip check
COPY deploy/image ./deploy/image
# ipamd-cni's private runtime: the interpreter, its libraries and the stdlib modules the plugin
# imports, built from this image's Python (deploy/image/build_cni_bundle.py says why and how).
RUN /opt/ipamd/venv/bin/python3 deploy/image/build_cni_bundle.py /opt/ipamd/cni/bundle
# The file the node executes as `ipamd-cni`: static, so it needs nothing from the node.
RUN gcc -static -Os -s -Wall -Wextra -Werror -o /opt/ipamd/cni/ipamd-cni deploy/image/cni-launcher.c

# --- runtime ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
# nft: ipamd replaces its SNAT table (`table ip ipamd`) with it, atomically.
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/ipamd /opt/ipamd
COPY deploy/cni/10-ipamd.conflist /opt/ipamd/cni/10-ipamd.conflist
COPY deploy/image/install-cni.sh deploy/image/ipamd_probe.py deploy/image/host-sysctls.sh /opt/ipamd/bin/
ENV PATH=/opt/ipamd/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    IPAMD_LOG_FORMAT=json
# Not root by default. The DaemonSet runs its containers as root (ipamd with NET_ADMIN alone,
# the installer with no capability), because the node paths they write (CNI dirs, socket and state
# dirs) and the containerd socket belong to root; `docker run ipamd:... ipamctl ...` needs none.
USER 65532:65532
ENTRYPOINT ["/opt/ipamd/venv/bin/ipamd"]
CMD ["run"]
