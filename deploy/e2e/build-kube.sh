#!/usr/bin/env bash
# Build pinned upstream kube-apiserver, kube-scheduler and etcd from the Go
# module proxy, for the end-to-end tests (tests/e2e). Needs only Go and the
# module proxy: no git, no GitHub, no dl.k8s.io, no C compiler.
#
# Output is cached outside the source tree:
#   ${GPUSLICE_KUBE_CACHE:-$HOME/.cache/gpuslice/kube}/<k8s>-<etcd>/bin/
# A second run finds the binaries and returns at once. The last line on stdout
# is always the bin dir; progress goes to stderr.
set -euo pipefail

KUBE_VERSION="v1.34.4"  # k8s.io/kubernetes; staging modules are v0.<minor>.<patch>
ETCD_VERSION="v3.6.16"  # go.etcd.io/etcd/server/v3 (its main package is the etcd binary)

CONTAINERD_VERSION="v2.2.9"  # github.com/containerd/containerd/v2 (containerd, ctr): the e2e-node runtime
COREDNS_VERSION="v1.13.2"  # github.com/coredns/coredns: the cluster DNS of the install suite (make e2e-install)

CACHE_ROOT="${GPUSLICE_KUBE_CACHE:-${HOME}/.cache/gpuslice/kube}"
DEST="${CACHE_ROOT}/${KUBE_VERSION}-${ETCD_VERSION}"
BINARIES=(etcd kube-apiserver kube-scheduler)

# `build-kube.sh node` builds the real node on top (make e2e-node): kubelet from the same pinned
# sources into the same bin dir, and containerd, ctr and the runc shim into a dir of their own. Each is an extra
# file, renamed into place, so the control plane binaries others use are never rebuilt or moved.
# `build-kube.sh install` builds what a full cluster adds on top of the node (make e2e-install):
# kube-controller-manager, kube-proxy and kubectl from the same sources into the same bin dir, and CoreDNS
# into a dir of its own; it prints a third line, CoreDNS's bin dir.
WANT_NODE=0
WANT_INSTALL=0
[[ "${1:-}" == "node" ]] && WANT_NODE=1
[[ "${1:-}" == "install" ]] && WANT_NODE=1 && WANT_INSTALL=1
CONTAINERD_DEST="${CACHE_ROOT}/containerd-${CONTAINERD_VERSION}"
COREDNS_DEST="${CACHE_ROOT}/coredns-${COREDNS_VERSION}"
INSTALL_BINARIES=(kube-controller-manager kube-proxy kubectl)

log() { printf '[build-kube] %s\n' "$*" >&2; }

have_all() {
  local b
  for b in "${BINARIES[@]}"; do
    [[ -x "${DEST}/bin/${b}" ]] || return 1
  done
}

have_node() {
  [[ "${WANT_NODE}" == 0 ]] ||
    { [[ -x "${DEST}/bin/kubelet" && -x "${CONTAINERD_DEST}/bin/containerd" && -x "${CONTAINERD_DEST}/bin/ctr" &&
      -x "${CONTAINERD_DEST}/bin/containerd-shim-runc-v2" ]]; }
}

have_install() {
  [[ "${WANT_INSTALL}" == 0 ]] && return 0
  local b
  for b in "${INSTALL_BINARIES[@]}"; do
    [[ -x "${DEST}/bin/${b}" ]] || return 1
  done
  [[ -x "${COREDNS_DEST}/bin/coredns" ]]
}

done_msg() {
  echo "${DEST}/bin"
  if [[ "${WANT_NODE}" == 1 ]]; then echo "${CONTAINERD_DEST}/bin"; fi
  if [[ "${WANT_INSTALL}" == 1 ]]; then echo "${COREDNS_DEST}/bin"; fi
}

if have_all && have_node && have_install; then
  done_msg
  exit 0
fi

# shellcheck source=deploy/e2e/toolchain.sh
source "$(dirname "${BASH_SOURCE[0]}")/toolchain.sh"
find_go

mkdir -p "${CACHE_ROOT}"

if lock_cache "${CACHE_ROOT}"; then
  if have_all && have_node && have_install; then
    done_msg
    exit 0
  fi
  # We hold the lock, so any other work dir is left over from a killed run.
  for stale in "${CACHE_ROOT}"/.build.*/; do
    [[ -d "${stale}" ]] || continue
    chmod -R u+w "${stale}" 2>/dev/null || true
    rm -rf "${stale}"
  done
fi

# Build next to the destination so the final mv is an atomic rename.
WORK="$(mktemp -d "${CACHE_ROOT}/.build.XXXXXX")"
cleanup() { chmod -R u+w "${WORK}" 2>/dev/null || true; rm -rf "${WORK}"; }
trap cleanup EXIT

# Static binaries: no C toolchain needed, and they run anywhere.
export CGO_ENABLED=0
# k8s.io/kubernetes ships a go.work that points into staging/; ignore it.
export GOWORK=off
export GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false"

# Print the extracted module directory of MODULE@VERSION (downloading it).
module_dir() {
  local json dir
  json="$("${GO}" mod download -json "$1")"
  dir="$(printf '%s\n' "${json}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  if [[ -z "${dir}" || ! -d "${dir}" ]]; then
    log "go mod download $1 failed:"
    printf '%s\n' "${json}" >&2
    return 1
  fi
  printf '%s\n' "${dir}"
}

# Copy a read-only module cache dir to a writable place and drop its local
# `replace` directives (single-line and block form) pointing at ./ or ../.
writable_copy() {
  local src="$1" dst="$2"
  cp -R "${src}" "${dst}"
  chmod -R u+w "${dst}"
  awk '
    /^replace[[:space:]]*\($/ { inblock = 1; next }
    inblock && /^\)$/         { inblock = 0; next }
    inblock                   { next }
    /^replace[[:space:]]/     { next }
    { print }
  ' "${dst}/go.mod" >"${dst}/go.mod.new"
  mv "${dst}/go.mod.new" "${dst}/go.mod"
}

# ---------------------------------------------------------------- kubernetes
prepare_kubernetes() {
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"
log "downloading k8s.io/kubernetes@${KUBE_VERSION}"
KSRC="$(module_dir "k8s.io/kubernetes@${KUBE_VERSION}")"
writable_copy "${KSRC}" "${WORK}/kubernetes"
# Staging modules are required as v0.0.0 (satisfied by the replaces we
# dropped); require the published versions instead.
staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "${KSRC}/go.mod")
if [[ -z "${staging}" ]]; then
  log "no staging replace directives found in k8s.io/kubernetes go.mod; layout changed?"
  exit 1
fi
edits=()
for m in ${staging}; do
  edits+=("-require=${m}@${STAGING_VERSION}")
done
(cd "${WORK}/kubernetes" && "${GO}" mod edit "${edits[@]}")

KV="${KUBE_VERSION#v}"
KMAJOR="${KV%%.*}"
KMINOR="${KV#*.}"
KMINOR="${KMINOR%%.*}"
BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
KLDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  KLDFLAGS+=" -X ${pkg}.gitVersion=${KUBE_VERSION}"
  KLDFLAGS+=" -X ${pkg}.gitMajor=${KMAJOR} -X ${pkg}.gitMinor=${KMINOR}"
  KLDFLAGS+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=${BUILD_DATE}"
done

}

if ! have_all; then
prepare_kubernetes
mkdir -p "${WORK}/out/bin"
log "building kube-apiserver and kube-scheduler ${KUBE_VERSION} (cold: 10-25 min on 2 cores)"
(cd "${WORK}/kubernetes" &&
  "${GO}" build -trimpath -ldflags "${KLDFLAGS}" -o "${WORK}/out/bin/" \
    ./cmd/kube-apiserver ./cmd/kube-scheduler)

# ---------------------------------------------------------------------- etcd
log "downloading go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
ESRC="$(module_dir "go.etcd.io/etcd/server/v3@${ETCD_VERSION}")"
writable_copy "${ESRC}" "${WORK}/etcd-server"
# The sibling modules (api, client/pkg, client/v3, pkg) are already required
# at ${ETCD_VERSION}; without the ../ replaces they come from the proxy.
log "building etcd ${ETCD_VERSION}"
(cd "${WORK}/etcd-server" &&
  "${GO}" build -trimpath -ldflags "-s -w" -o "${WORK}/out/bin/etcd" .)

for b in "${BINARIES[@]}"; do
  [[ -x "${WORK}/out/bin/${b}" ]] || { log "missing ${b} after build"; exit 1; }
done

# Atomic publish: rename a complete dir into place.
rm -rf "${DEST}"
mv "${WORK}/out" "${DEST}"
log "built into ${DEST}/bin"
fi

# ---------------------------------------------------------------- the node
if [[ "${WANT_NODE}" == 1 && ! -x "${DEST}/bin/kubelet" ]]; then
  [[ -d "${WORK}/kubernetes" ]] || prepare_kubernetes
  log "building kubelet ${KUBE_VERSION} (warm module cache: about 1 min)"
  (cd "${WORK}/kubernetes" &&
    "${GO}" build -trimpath -ldflags "${KLDFLAGS}" -o "${WORK}/kubelet" ./cmd/kubelet)
  mv "${WORK}/kubelet" "${DEST}/bin/kubelet"  # one extra file: the control plane is untouched
  log "built ${DEST}/bin/kubelet"
fi
if [[ "${WANT_NODE}" == 1 && ! ( -x "${CONTAINERD_DEST}/bin/containerd" && -x "${CONTAINERD_DEST}/bin/ctr" &&
      -x "${CONTAINERD_DEST}/bin/containerd-shim-runc-v2" ) ]]; then
  log "downloading github.com/containerd/containerd/v2@${CONTAINERD_VERSION}"
  CSRC="$(module_dir "github.com/containerd/containerd/v2@${CONTAINERD_VERSION}")"
  writable_copy "${CSRC}" "${WORK}/containerd"
  mkdir -p "${WORK}/containerd-out/bin"
  # Static, no cgo: drop the snapshotters that need C (btrfs) or are not used (devmapper).
  # CDI is built in and on by default in containerd 2.x.
  log "building containerd ${CONTAINERD_VERSION} (cold: 3-8 min on 2 cores)"
  (cd "${WORK}/containerd" &&
    "${GO}" build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}" \
      -o "${WORK}/containerd-out/bin/" ./cmd/containerd ./cmd/ctr ./cmd/containerd-shim-runc-v2)
  rm -rf "${CONTAINERD_DEST}"
  mv "${WORK}/containerd-out" "${CONTAINERD_DEST}"
  log "built into ${CONTAINERD_DEST}/bin"
fi
# ------------------------------------------------------------ the full cluster
if [[ "${WANT_INSTALL}" == 1 ]]; then
  missing=()
  for b in "${INSTALL_BINARIES[@]}"; do
    [[ -x "${DEST}/bin/${b}" ]] || missing+=("./cmd/${b}")
  done
  if ((${#missing[@]})); then
    [[ -d "${WORK}/kubernetes" ]] || prepare_kubernetes
    mkdir -p "${WORK}/install-out"
    log "building ${missing[*]} ${KUBE_VERSION} (warm module cache: 2-6 min)"
    (cd "${WORK}/kubernetes" &&
      "${GO}" build -trimpath -ldflags "${KLDFLAGS}" -o "${WORK}/install-out/" "${missing[@]}")
    for b in "${INSTALL_BINARIES[@]}"; do
      [[ -x "${WORK}/install-out/${b}" ]] && mv "${WORK}/install-out/${b}" "${DEST}/bin/${b}"
    done
    log "built ${missing[*]} into ${DEST}/bin"
  fi
  if [[ ! -x "${COREDNS_DEST}/bin/coredns" ]]; then
    log "downloading github.com/coredns/coredns@${COREDNS_VERSION}"
    DSRC="$(module_dir "github.com/coredns/coredns@${COREDNS_VERSION}")"
    writable_copy "${DSRC}" "${WORK}/coredns"
    mkdir -p "${WORK}/coredns-out/bin"
    log "building coredns ${COREDNS_VERSION} (cold: 4-8 min on 2 cores)"
    (cd "${WORK}/coredns" && "${GO}" build -trimpath -ldflags "-s -w" -o "${WORK}/coredns-out/bin/coredns" .)
    rm -rf "${COREDNS_DEST}"
    mv "${WORK}/coredns-out" "${COREDNS_DEST}"
    log "built into ${COREDNS_DEST}/bin"
  fi
fi
done_msg
