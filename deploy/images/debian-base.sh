#!/usr/bin/env bash
# Base images for `make image` made from Debian packages alone (mmdebstrap): for a machine that reaches
# a Debian mirror but no container registry. Two images, each of a pinned Debian suite:
#
#   localhost/gpuslice-python:bookworm   python3 + venv (Debian 12: Python 3.11), the extender's and
#                                         the agent's base (PYTHON_IMAGE)
#   localhost/gpuslice-cc:bullseye       gcc, libc6-dev, make (Debian 11: glibc 2.31), where the
#                                         in-container limiter is built (LIMITER_IMAGE)
#
#   deploy/images/debian-base.sh            # both; the last two lines say PYTHON_IMAGE=... LIMITER_IMAGE=...
#   make image $(deploy/images/debian-base.sh | tail -2 | xargs)
#
# The root filesystems are cached as tars in ${GPUSLICE_IMAGE_CACHE:-~/.cache/gpuslice/images}; an image
# already in the builder's store is not imported again. The builder is $BUILDER, else podman, else buildah.
# Certificates the machine adds to its trust (/usr/local/share/ca-certificates/*.crt, e.g. a TLS-inspecting
# proxy's) go into the python base too, so `pip` inside the build trusts what the machine trusts.
# Needs root (mmdebstrap's root mode) and: apt-get install mmdebstrap podman (or buildah).
set -euo pipefail

PYTHON_SUITE="bookworm"   # Debian 12: Python 3.11 (the project's minimum)
CC_SUITE="bullseye"       # Debian 11: glibc 2.31, the oldest glibc the limiter loads into
MIRROR="${GPUSLICE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CACHE="${GPUSLICE_IMAGE_CACHE:-${HOME}/.cache/gpuslice/images}"
BUILDER="${BUILDER:-$(command -v podman || command -v buildah || true)}"

log() { printf '[debian-base] %s\n' "$*" >&2; }

[[ -n "${BUILDER}" ]] || { log "no podman or buildah on this machine (apt-get install podman, or set BUILDER)"; exit 2; }
command -v mmdebstrap >/dev/null || { log "mmdebstrap is missing (apt-get install mmdebstrap)"; exit 2; }
mkdir -p "${CACHE}"

# the image's name is in the builder's store already
have_image() { "${BUILDER}" inspect --type image "$1" >/dev/null 2>&1; }

# build <name> <suite> <packages> [hook...]: the root filesystem as a tar (cached), imported as <name>
build() {
  local name="$1" suite="$2" packages="$3"
  shift 3
  local tar="${CACHE}/${name##*/}.tar"
  tar="${tar/:/-}"
  if have_image "${name}"; then
    log "${name}: in the store already"
    return
  fi
  if [[ ! -s "${tar}" ]]; then
    log "${name}: mmdebstrap ${suite} (${packages}); 1-2 min"
    # documentation, man pages and locales are no use in a server image; apt's lists are dropped at the end
    mmdebstrap --quiet --format=tar --variant=minbase --include="${packages}" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
      --aptopt='Acquire::Languages "none"' "$@" \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
      "${suite}" "${tar}.part" "${MIRROR}"
    mv "${tar}.part" "${tar}"
  fi
  log "${name}: importing ${tar}"
  "${BUILDER}" import --quiet "${tar}" "${name}" >/dev/null
}

extra_ca=()
for crt in /usr/local/share/ca-certificates/*.crt; do
  [[ -f "${crt}" ]] || continue
  extra_ca+=(--customize-hook="copy-in ${crt} /usr/local/share/ca-certificates/")
done
if ((${#extra_ca[@]})); then
  extra_ca+=(--customize-hook='chroot "$1" update-ca-certificates >/dev/null 2>&1')
fi

# merged /usr by usr-is-merged, not by usrmerge (which pulls in perl: 47 MB the image never runs)
build "localhost/gpuslice-python:${PYTHON_SUITE}" "${PYTHON_SUITE}" "python3,python3-venv,ca-certificates" \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "${extra_ca[@]}"
build "localhost/gpuslice-cc:${CC_SUITE}" "${CC_SUITE}" "gcc,libc6-dev,make"

echo "PYTHON_IMAGE=localhost/gpuslice-python:${PYTHON_SUITE}"
echo "LIMITER_IMAGE=localhost/gpuslice-cc:${CC_SUITE}"
