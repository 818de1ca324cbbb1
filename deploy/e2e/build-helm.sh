#!/usr/bin/env bash
# Build a pinned helm from its Go module (the module proxy only: no GitHub, no get.helm.sh), for the
# chart tests (tests/chart) and the end-to-end suite, which render deploy/chart with it.
#
# Output is cached outside the source tree:
#   ${GPUSLICE_HELM_CACHE:-$HOME/.cache/gpuslice/helm}/<version>/bin/helm
# A second run finds the binary and returns at once. The last line on stdout is always the
# binary's path; progress goes to stderr.
set -euo pipefail

HELM_VERSION="v4.3.1"  # helm.sh/helm/v4

CACHE_ROOT="${GPUSLICE_HELM_CACHE:-${HOME}/.cache/gpuslice/helm}"
DEST="${CACHE_ROOT}/${HELM_VERSION}"
BIN="${DEST}/bin/helm"

log() { printf '[build-helm] %s\n' "$*" >&2; }

if [[ -x "${BIN}" ]]; then
  echo "${BIN}"
  exit 0
fi

# shellcheck source=deploy/e2e/toolchain.sh
source "$(dirname "${BASH_SOURCE[0]}")/toolchain.sh"
find_go
mkdir -p "${CACHE_ROOT}"

if lock_cache "${CACHE_ROOT}" && [[ -x "${BIN}" ]]; then
  echo "${BIN}"
  exit 0
fi

WORK="$(mktemp -d "${CACHE_ROOT}/.build.XXXXXX")"
cleanup() { rm -rf "${WORK}"; }
trap cleanup EXIT

# `go install pkg@version` builds the module exactly as its go.mod pins it (it has no replace
# directives), static and without a C toolchain.
log "building helm ${HELM_VERSION} (cold: a few minutes on 2 cores)"
mkdir -p "${WORK}/bin"
CGO_ENABLED=0 GOWORK=off GOBIN="${WORK}/bin" GOFLAGS="-buildvcs=false" \
  "${GO}" install -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=${HELM_VERSION}" \
  "helm.sh/helm/v4/cmd/helm@${HELM_VERSION}"
[[ -x "${WORK}/bin/helm" ]] || { log "no helm binary after the build"; exit 1; }
rm -rf "${DEST}"
mv "${WORK}" "${DEST}"
trap - EXIT
log "built ${BIN}"
echo "${BIN}"
