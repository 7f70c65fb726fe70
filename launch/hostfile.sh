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
[[ -f "$hostfile" && -r "$hostfile" ]] || { echo "hostfile.sh: error: hostfile $hostfile: not found or not readable" >&2; exit 2; }
[[ -n "$n" ]] || { echo "hostfile.sh: error: -n N is required (see -h)" >&2; exit 2; }
is_count "$n" || { echo "hostfile.sh: error: -n $n: $(count_problem "$n" "a positive number of workers")" >&2; exit 2; }
[[ "$map" == slot || "$map" == node ]] || { echo "hostfile.sh: error: -m $map: expected slot or node" >&2; exit 2; }

# check_hostfile: the hostfile's mistakes in one line each, before mpirun (whose boxes for them said "No nodes
# are available", "already filled", "slots=-1" for slots=abc, or only "input in flex scanner failed").
# Each line: a host, then key=value words of Open MPI's hostfile syntax (slots=K and max_slots=K positive, below
# 10^9); '#' starts a comment; Windows line ends are refused (Open MPI's parser fails on them).
# With every host's slots given, -n must fit in them unless HOPDEC_MPIRUN_ARGS has --oversubscribe.
check_hostfile() {
    local line no=0 hosts=0 total=0 counted=1 word key value words
    while IFS= read -r line || [[ -n "$line" ]]; do
        no=$((no + 1))
        line="${line%%#*}"
        if [[ "$line" == *$'\r'* ]]; then   # (Open MPI's parser fails on it; our check said "slots=2: need a positive number")
            echo "hostfile.sh: error: hostfile $hostfile line $no: ends in a carriage return (Windows line ends): convert the file, e.g. dos2unix $hostfile" >&2
            exit 2
        fi
        read -r -a words <<< "$line" || true
        [[ ${#words[@]} -gt 0 ]] || continue
        hosts=$((hosts + 1))
        [[ "${words[0]}" != *=* ]] || { echo "hostfile.sh: error: hostfile $hostfile line $no: starts with ${words[0]}, expected a host name" >&2; exit 2; }
        local slots=""
        for word in "${words[@]:1}"; do
            if [[ "$word" != *=* ]]; then
                echo "hostfile.sh: error: hostfile $hostfile line $no: '$word' is not key=value (expected e.g. '${words[0]} slots=4')" >&2
                exit 2
            fi
            key="${word%%=*}" value="${word#*=}"
            case "$key" in
                slots|count|cpu|max_slots|max-slots|slots_max|slots-max|max_count|max-count|count_max|count-max|\
                max_cpu|max-cpu|cpu_max|cpu-max)
                    is_count "$value" || { echo "hostfile.sh: error: hostfile $hostfile line $no: $word: $(count_problem "$value" "a positive number")" >&2; exit 2; }
                    [[ "$key" != slots && "$key" != count ]] || slots="$value" ;;
                rank|slot|username|user-name|user_name|port|boards|sockets|sockets_per_board|sockets-per-board|\
                cores|cores_per_socket|cores-per-socket) ;;
                *)  echo "hostfile.sh: error: hostfile $hostfile line $no: $word: Open MPI's hostfiles have no key '$key' (expected e.g. '${words[0]} slots=4')" >&2
                    exit 2 ;;
            esac
        done
        if [[ -n "$slots" ]]; then total=$((total + slots)); else counted=0; fi
    done < "$hostfile"
    (( hosts > 0 )) || { echo "hostfile.sh: error: hostfile $hostfile: no hosts (one 'host slots=K' a line)" >&2; exit 2; }
    if (( counted && n > total )) && ! user_sets --oversubscribe; then
        echo "hostfile.sh: error: -n $n: hostfile $hostfile has $total slot(s); give its hosts more slots, or run more ranks than slots with HOPDEC_MPIRUN_ARGS=--oversubscribe" >&2
        exit 2
    fi
}
check_hostfile

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
