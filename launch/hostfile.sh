#!/usr/bin/env bash
# Run N hopdec workers over several machines listed in an Open MPI hostfile.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: launch/hostfile.sh -f HOSTFILE -n N [-m slot|node] [--] [hopdec train args...]

Runs N workers across the machines in HOSTFILE (Open MPI format, one "host slots=K" a line):
  mpirun --hostfile HOSTFILE -n N --map-by slot|node --bind-to none -x PATH -x PYTHONPATH ...
  -m slot  (default) fill each host's slots before the next: neighbouring ranks share a machine
  -m node  round-robin ranks over hosts
Every host needs the same Python environment and checkout path (PATH, PYTHONPATH and
VIRTUAL_ENV are passed on with -x) and passwordless ssh between hosts.

Environment: HOPDEC_CMD, HOPDEC_MPIRUN, HOPDEC_MPIRUN_ARGS, HOPDEC_PYTHON, HOPDEC_STOP_GRACE as in local.sh, and
  HOPDEC_INTERFACE=eth1  keep the ranks' and daemons' traffic on that interface's network;
                         what a job exposes, and how to firewall it: launch/README.md
USAGE
}

source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

hostfile="" n="" map="slot"
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        -f|--hostfile|-n|--np|-m|--map-by)
            [[ $# -ge 2 ]] || { echo "hostfile.sh: error: $1 needs a value" >&2; exit 2; }
            case "$1" in
                -f|--hostfile) hostfile="$2" ;;
                -n|--np) n="$2" ;;
                *) map="$2" ;;
            esac
            shift 2 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
[[ -n "$hostfile" ]] || { echo "hostfile.sh: error: -f HOSTFILE is required (see -h)" >&2; exit 2; }
[[ -r "$hostfile" ]] || { echo "hostfile.sh: error: hostfile $hostfile: not found or not readable" >&2; exit 2; }
[[ -n "$n" ]] || { echo "hostfile.sh: error: -n N is required (see -h)" >&2; exit 2; }
is_count "$n" || { echo "hostfile.sh: error: -n $n: need a positive number of workers" >&2; exit 2; }
[[ "$map" == slot || "$map" == node ]] || { echo "hostfile.sh: error: -m $map: expected slot or node" >&2; exit 2; }

worker_cmd
mpirun_base
ft_flags "$@"
net_flags cluster "$@"
MPIRUN+=(--hostfile "$hostfile" -n "$n" --map-by "$map")
resume_with "$0" -f "$hostfile" -n "$n" -m "$map"
for var in PATH PYTHONPATH VIRTUAL_ENV LD_LIBRARY_PATH HOPDEC_NETWORK; do   # (the testbed's conditions)
    if [[ -n "${!var:-}" ]]; then MPIRUN+=(-x "$var"); fi
done
extra_flags
run_job "${MPIRUN[@]}" "${WORKER_CMD[@]}" "$@"   # Ctrl-C: a clean stop (see _common.sh)
