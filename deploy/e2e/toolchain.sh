# Sourced by the build-*.sh scripts: the Go toolchain and the cache lock they share.
# Needs a `log` function from the sourcing script.

# Set GO to the go binary ($GO, else PATH, else /usr/local/go), or fail with a message.
find_go() {
  GO="${GO:-$(command -v go || true)}"
  if [[ -z "${GO}" && -x /usr/local/go/bin/go ]]; then
    GO=/usr/local/go/bin/go
  fi
  if [[ -z "${GO}" ]]; then
    log "go not found on PATH (nor /usr/local/go/bin/go); set GO=/path/to/go"
    return 1
  fi
  log "using $("${GO}" version)"
}

# Hold the cache's build lock on fd 9 until the script exits, so two builds starting together build once.
# Returns 1 where flock is missing: the caller then builds unserialised.
lock_cache() {
  command -v flock >/dev/null 2>&1 || return 1
  exec 9>"$1/.build.lock"
  flock 9
}
