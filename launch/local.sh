#!/usr/bin/env bash
# Run N hopdec workers on this machine: mpirun -n N ... hopdec train [args].
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: launch/local.sh [-n N] [--] [hopdec train args...]

Runs N workers (default 4) on this machine, one MPI rank each:
  mpirun -n N --oversubscribe --bind-to none --mca btl ^tcp [--allow-run-as-root] hopdec train ARGS...
(--oversubscribe: more ranks than cores is fine on one box; --mca btl ^tcp: the ranks talk over shared
memory and listen on no network port -- with --fault-tolerance, TCP over 127.0.0.1 only;
--allow-run-as-root only as root.) Ctrl-C, SIGTERM, SIGHUP: a clean stop (launch/README.md).
With --fault-tolerance among the args the script adds what Open MPI's ULFM needs (launch/_common.sh).

Environment:
  HOPDEC_CMD          run this command on every rank instead of `hopdec train`
                      (the arguments are appended), e.g.
                      HOPDEC_CMD="python3 -c 'from mpi4py import MPI; print(MPI.COMM_WORLD.rank)'"
  HOPDEC_MPIRUN       launcher binary (default: mpirun)
  HOPDEC_MPIRUN_ARGS  extra launcher flags (last: they win), e.g. "--mca btl self,tcp"
  HOPDEC_STARTUP_TIMEOUT  seconds every rank has to get through MPI_Init (default: --peer-timeout, >= 60)
  HOPDEC_FT_TIMEOUT   --fault-tolerance: seconds of silence before ULFM's detector declares a rank dead (30)
  HOPDEC_STOP_GRACE   seconds a job whose launcher died has to stop cleanly before SIGTERM (120)
  HOPDEC_PYTHON       python used when hopdec is not on PATH (default: python3)
  HOPDEC_MAX_PER_CORE refuse -n above this many ranks per core of this machine (default 64)
USAGE
}

source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

n=4
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        -n|--np)
            [[ $# -ge 2 ]] || { echo "local.sh: error: $1 needs a number of workers" >&2; exit 2; }
            n="$2"; shift 2 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
is_count "$n" || { echo "local.sh: error: -n $n: $(count_problem "$n" "a positive number of workers")" >&2; exit 2; }
# a typo (-n 100000) would start ranks until the machine runs out of memory (each imports torch: ~0.3 GB)
cores=$(nproc 2>/dev/null || echo 1)
per_core="${HOPDEC_MAX_PER_CORE:-64}"
is_count "$per_core" || { echo "local.sh: error: HOPDEC_MAX_PER_CORE=$per_core: $(count_problem "$per_core" "a positive number")" >&2; exit 2; }
if (( n > per_core * cores )); then
    echo "local.sh: error: -n $n: more than $per_core ranks per core on this machine's $cores core(s); each" \
         "rank is a process that imports torch -- use launch/hostfile.sh across machines, or hopdec sim for" \
         "thousands of simulated workers (HOPDEC_MAX_PER_CORE raises the limit)" >&2
    exit 2
fi

worker_cmd
mpirun_base
ft_flags "$@"
net_flags one-host "$@"
MPIRUN+=(-n "$n" --oversubscribe)
resume_with "$0" -n "$n"
extra_flags
run_job "${MPIRUN[@]}" "${WORKER_CMD[@]}" "$@"   # Ctrl-C: a clean stop (see _common.sh)
