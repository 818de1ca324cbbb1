#!/usr/bin/env bash
# The limiter's assertions through a real NVIDIA driver and nvidia-smi, with an 8192 MiB slice
# whatever the card. Run it by hand on a GPU machine, from anywhere:
#
#   enforcement/interposer/real_gpu_check.sh
#
# It builds the library with `make interposer` (or uses $GPUSLICE_LIMITER_LIB), then runs the
# same clients as the tests (check_client.py, ctypes on libcuda.so.1 / libnvidia-ml.so.1) with
# the library preloaded, and reads the agent's view (per-process memory) without it. With torch
# or cupy installed it also checks the CUDA runtime's path; without them those steps say SKIP.
#
# Exit codes: 0 every check passed; 1 a check failed; 2 no GPU here (nothing was checked).
# Overrides: NVIDIA_SMI (default nvidia-smi), PYTHON (default python3), GPUSLICE_LIMITER_LIB.
set -uo pipefail

CAP_MIB=8192
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
PYTHON=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
client="$here/check_client.py"
passed=0
failed=0

no_gpu() {
    echo "NO GPU: $*" >&2
    echo "real_gpu_check: not run: it needs an NVIDIA GPU and its driver (nothing was checked)" >&2
    exit 2
}

check() { # check NAME CONDITION-STATUS DETAIL
    if [ "$2" -eq 0 ]; then
        passed=$((passed + 1)); echo "ok      $1: $3"
    else
        failed=$((failed + 1)); echo "FAILED  $1: $3"
    fi
}

field() { # field JSON PYTHON-EXPRESSION-ON-d
    "$PYTHON" -c 'import json,sys; d=json.loads(sys.argv[1]); print(eval(sys.argv[2]))' "$1" "$2"
}

command -v "$NVIDIA_SMI" >/dev/null 2>&1 || no_gpu "$NVIDIA_SMI not found"
gpus=$("$NVIDIA_SMI" -L 2>&1) || no_gpu "$NVIDIA_SMI -L failed: $gpus"
[ -n "$gpus" ] || no_gpu "$NVIDIA_SMI lists no GPU"
probe=$("$PYTHON" "$client" probe 2>&1) || no_gpu "libcuda.so.1: $probe"
[ "$(field "$probe" 'd["cuInit"]')" = 0 ] && [ "$(field "$probe" 'd["devices"]')" -gt 0 ] ||
    no_gpu "cuInit or cuDeviceGetCount failed: $probe"
echo "GPUs:"; echo "$gpus" | sed 's/^/  /'

lib=${GPUSLICE_LIMITER_LIB:-$(make -s -C "$repo" interposer | tail -n 1)}
[ -f "$lib" ] || { echo "FAILED: no limiter library at '$lib'"; exit 1; }
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT
limited_env=(env "LD_PRELOAD=$lib${LD_PRELOAD:+ $LD_PRELOAD}" "GPUSLICE_SLICE_MEMORY_MIB=$CAP_MIB"
    "GPUSLICE_SLICE_STATE_DIR=$state")
limited() { "${limited_env[@]}" "$@"; }
echo "limiter: $lib, cap $CAP_MIB MiB, state in $state"

# 1. nvidia-smi inside the slice: every visible card reads the cap
smi=$(limited "$NVIDIA_SMI" --query-gpu=name,memory.total --format=csv,noheader,nounits)
bad=$(echo "$smi" | awk -F', *' -v cap=$CAP_MIB '$2 != cap' | wc -l)
check "nvidia-smi total" "$bad" "$(echo "$smi" | tr '\n' ';')"
card=$("$NVIDIA_SMI" --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
check "nvidia-smi without the limiter" "$([ "$card" -gt $CAP_MIB ]; echo $?)" "card 0 has $card MiB"

# 2. CUDA driver totals through ctypes
out=$(limited "$PYTHON" "$client" totals)
check "cuDeviceTotalMem_v2" "$([ "$(field "$out" 'd["devices"][0]["total_mib"]')" = $CAP_MIB ]; echo $?)" "$out"
check "cuMemGetInfo_v2 total" "$([ "$(field "$out" 'd["info"]["total_mib"]')" = $CAP_MIB ]; echo $?)" "$out"
free_seen=$(field "$out" 'd["info"]["free_mib"]')

# 3. 7 GiB fit, 2 GiB more do not (CUDA_ERROR_OUT_OF_MEMORY), after a free they do
out=$(limited "$PYTHON" "$client" sequence)
check "7 GiB / 2 GiB / free / 2 GiB" "$([ "$(field "$out" 'd["rcs"]')" = "[0, 2, 0, 0]" ]; echo $?)" \
    "$(field "$out" 'd["rcs"]')"

# 4. the runtime's lookup path
out=$(limited "$PYTHON" "$client" procaddress)
check "cuGetProcAddress_v2(cuMemAlloc)" "$([ "$(field "$out" 'd["past_cap_rc"]')" = 2 ]; echo $?)" "$out"

# 5. two processes, one budget; SIGKILL gives the share back
coproc HOLDER { exec "${limited_env[@]}" "$PYTHON" "$client" hold 5000; }
read -r held <&"${HOLDER[0]}"
out=$(limited "$PYTHON" "$client" hold 3000 </dev/null)
check "second process refused" "$([ "$(field "$out" 'd["rc"]')" = 2 ]; echo $?)" "first: $held; second: $out"
kill -KILL "$HOLDER_PID"; wait "$HOLDER_PID" 2>/dev/null
out=$(limited "$PYTHON" "$client" hold 3000 </dev/null)
check "share back after SIGKILL" "$([ "$(field "$out" 'd["rc"]')" = 0 ]; echo $?)" "$out"

# 6. filled to the cap, the agent's view (NVML per process, no limiter) stays under it
watch_under_cap() { # NAME CLIENT-ARGS...
    local name=$1; shift
    coproc FILLER { exec "${limited_env[@]}" "$PYTHON" "$client" "$@" --hold; }
    local got view pid used to_filler=${FILLER[1]}
    read -r got <&"${FILLER[0]}"
    pid=$FILLER_PID
    view=$("$NVIDIA_SMI" --query-compute-apps=pid,used_memory --format=csv,noheader,nounits)
    used=$(echo "$view" | awk -F', *' -v pid="$pid" '$1 == pid {print $2}')
    exec {to_filler}>&-
    wait "$pid"
    local allocated
    allocated=$(field "$got" 'd["allocated_mib"]')
    check "$name under the cap in NVML" "$([ -n "$used" ] && [ "$used" -le $CAP_MIB ]; echo $?)" \
        "allocated $allocated MiB, NVML shows ${used:-nothing} MiB for pid $pid (context: $((${used:-0} - allocated)) MiB)"
}
watch_under_cap "filled" fill --chunk-mib 64

# 7. the Ollama-like client: reads free memory, takes 90 % of it
watch_under_cap "ollama-like" ollama
out=$(limited "$PYTHON" "$client" ollama </dev/null)
check "ollama-like sized itself" "$([ "$(field "$out" 'd["refused"]')" = 0 ] &&
    [ "$(field "$out" 'd["total_read_mib"]')" = $CAP_MIB ]; echo $?)" "$out"

# 8. pass-through: the library loaded, the variables unset: the driver's own answers
out=$(env LD_PRELOAD="$lib" "$PYTHON" "$client" totals)
alone=$("$PYTHON" "$client" totals)
check "pass-through" "$([ "$(field "$out" 'd["devices"]')" = "$(field "$alone" 'd["devices"]')" ] &&
    [ "$(field "$out" 'd["devices"][0]["total_mib"]')" -gt $CAP_MIB ]; echo $?)" "$out"

# 9. the CUDA runtime (cudart via cuGetProcAddress), where a framework is installed
runtime() { # NAME PYTHON-CODE printing "total_mib refused"
    if ! "$PYTHON" -c "import $1" 2>/dev/null; then echo "SKIP    $1: not installed"; return; fi
    local out
    out=$(limited "$PYTHON" -c "$2" 2>&1 | tail -n 1)
    check "$1 through the CUDA runtime" "$([ "$out" = "$CAP_MIB refused" ]; echo $?)" "$out"
}
runtime torch 'import torch
free, total = torch.cuda.mem_get_info()
try:
    torch.empty(9 << 30, dtype=torch.uint8, device="cuda"); print(total >> 20, "allocated")
except torch.cuda.OutOfMemoryError:
    print(total >> 20, "refused")'
runtime cupy 'import cupy
free, total = cupy.cuda.runtime.memGetInfo()
try:
    cupy.cuda.runtime.malloc(9 << 30); print(total >> 20, "allocated")
except cupy.cuda.runtime.CUDARuntimeError:
    print(total >> 20, "refused")'

echo "free read by a fresh process: $free_seen MiB of $CAP_MIB"
echo "real_gpu_check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
