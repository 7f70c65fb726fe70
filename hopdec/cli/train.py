"""``hopdec train``: one worker per MPI rank (``mpirun -n 8 hopdec train --topology FILE``).

Every rank parses the options into settings (:func:`parse`: a bad option is one line from rank 0, before
MPI starts), then checks and loads everything else (:func:`hopdec.runtime.setup.setup`: topology size
against the number of ranks, model, data, log directory, checkpoints) *before* any training message is
sent; the ranks exchange what they found (a bounded allgather) and a problem is printed once, by the
lowest rank that found it, and every rank exits 2. Anything that goes wrong later ends every rank with one
line naming the rank and the cause (:mod:`hopdec.runtime.failures`). The run goes to its mode's MPI runner
(:mod:`hopdec.runtime.hop_mpi`, :mod:`hopdec.runtime.ps_mpi`, :mod:`hopdec.runtime.allreduce_mpi`).
"""

import os
import sys
import time

from hopdec.cli.helpfmt import Parser
from hopdec.errors import ConfigError, HopdecError
from hopdec.launcher import launcher_rank, under_launcher

PROG = "hopdec train"


class _Parser(Parser):
    """The one-line error parser (:class:`hopdec.cli.helpfmt.Parser`) that prints --help on rank 0 only."""

    def print_help(self, file=None):
        if launcher_rank() == 0:
            super().print_help(file)


def build_parser():
    from hopdec.cli.helpfmt import HelpFormatter
    from hopdec.cli.options import add_run_arguments
    p = _Parser(prog=PROG, description="Train one worker per MPI rank: mpirun -n 8 hopdec train --topology "
                "FILE (add --oversubscribe with fewer cores than ranks, --allow-run-as-root as root).",
                formatter_class=HelpFormatter)
    add_run_arguments(p)
    return p


def parse(argv):
    """The settings of ``hopdec train ARGV`` (:class:`hopdec.settings.RunSettings`); ConfigError (one
    line naming the option) for anything the options alone show is wrong."""
    from hopdec.cli.options import settings_from
    return settings_from(build_parser().parse_args(argv), argv)


RUNNERS = {"decentralized": "hopdec.runtime.hop_mpi", "ps": "hopdec.runtime.ps_mpi",
           "allreduce": "hopdec.runtime.allreduce_mpi"}
"""Each mode's MPI runner (a module with ``run(ctx)``)."""


def main(argv):
    """Parse, set up on every rank, exchange setup errors (printed once), then run under a guard that
    turns any failure on any rank into one line and an abort of the whole job."""
    ft = "--fault-tolerance" in argv
    if ft:
        from hopdec.runtime.failures import record_started
        record_started()                    # (the launcher then knows a job that ends without a word failed)
    from hopdec.runtime import interrupt
    interrupt.install()                     # Ctrl-C / SIGTERM / SIGUSR1: a clean stop, never a traceback
    try:
        settings = parse(argv)
    except ConfigError as err:              # every rank parses the same argv: say it once
        if launcher_rank() == 0:
            print(f"{PROG}: error: {err}", file=sys.stderr, flush=True)
            from hopdec.runtime.failures import forwarded
            forwarded()                     # the launcher has the line before this exit ends the job
            return _finish(2, ft)
        if not ft:                          # (with it, _finish's MPI_Init waits for rank 0, then its abort)
            _outlived_by_rank_0()
        return _finish(2, ft, reporter=False)
    import importlib

    from hopdec.runtime.failures import ABORT_CODE, abort, cause, first_error, slow_detector_note
    from hopdec.runtime.resume import plan
    from hopdec.runtime.setup import check_resume_target, continue_run, first_disagreement, setup, \
        shared_by_every_rank
    from hopdec.runtime.startup import setup_done, start
    from hopdec.transport.collectives import allgather_json

    timeout = settings.faults.timeout
    comm = start(timeout, PROG)             # MPI_Init and a roll call, each bounded: one line names who is missing
    rank = comm.Get_rank()
    err = shared = None
    try:
        ctx = setup(settings, comm)
        shared = shared_by_every_rank(ctx)
    except Exception as e:                  # bad input (one line), or a bug: still one line
        err = cause(e)
    try:
        import uuid
        setup_done(comm, timeout)           # one line names a rank still in setup
        got = allgather_json(comm, [err, uuid.uuid4().hex[:12], shared], timeout, "setup")
        found = first_error([g[0] for g in got]) or first_disagreement([g[2] for g in got])
        if found is None:
            ctx.run_id = got[0][1]          # rank 0's: one id for every rank's log header
    except Exception as e:
        abort(comm, e, PROG)
    if found is None and settings.checkpoints.resume is not None:  # the ranks compare their manifests
        try:
            ctx.resume = plan(ctx, ctx.fingerprint, timeout)
            check_resume_target(ctx)
            continue_run(ctx)               # with --local-steps: the rounds from the checkpoint's inner step
        except HopdecError as e:            # the same on every rank: printed once, below
            found = (0, cause(e))
        except Exception as e:
            abort(comm, e, PROG)
    if found is not None:
        if rank == found[0]:
            print(f"{PROG}: error: {found[1]}", file=sys.stderr, flush=True)
        if ft:                              # the reporter's abort must not cut the exchange short elsewhere
            try:
                from hopdec.transport.collectives import barrier
                barrier(comm, timeout, "setup")
            except Exception:
                pass
        return _finish(2, ft, reporter=rank == found[0])
    if rank == 0:                           # the data's (shards smaller than a batch), once
        slow = (slow_detector_note(settings.faults.peer_timeout, comm.Get_size())
                if settings.faults.fault_tolerance else None)
        for note in (*ctx.run.work.notes, *settings.observe.unseen(), *([slow] if slow else [])):
            print(f"{PROG}: note: {note}", file=sys.stderr, flush=True)
    if settings.mode == "decentralized" and comm.Get_size() == 1 and not under_launcher():
        print(f"{PROG}: note: running 1 worker; start N workers with `mpirun -n N hopdec train ...` "
              f"or `launch/local.sh -n N ...`", file=sys.stderr, flush=True)
    try:
        importlib.import_module(RUNNERS[settings.mode]).run(ctx)
    except BaseException as e:              # training, evaluation or shutdown, on any rank
        # bad input found only once the run was built (a checkpoint that does not fit the model): exit 2
        abort(comm, e, PROG, code=2 if isinstance(e, ConfigError) else ABORT_CODE)
    if ft:                                  # nobody exits while rank 0 still gathers from it
        from hopdec.transport.ulfm import leave_together
        leave_together(ctx.comm, timeout)
    from hopdec.runtime.failures import stop_exit_code
    return _finish(stop_exit_code(), ft, stopped=True)     # a stopped run must not look completed


PARSE_WAIT_S = 30.0
"""How long a rank other than 0 waits, after the options are refused, for rank 0's exit to end the job."""


def _outlived_by_rank_0(bound=PARSE_WAIT_S):
    """A rank other than 0 whose options were refused (each rank finds the same mistake; only rank 0 says
    it) waits for rank 0's exit to end the job: exiting first, with 2, it ended the job itself -- mpirun
    kills the rest at a non-zero exit -- while rank 0, still importing on a loaded machine, had not printed
    yet, and the job failed without a word. Up to ``bound`` s; at once on a stop request (the launcher's
    SIGTERM once rank 0 has exited). Not where MPI is already up (``main`` called in a process that goes on,
    e.g. several runs in one job): rank 0 does not exit then, so nothing would end the wait."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized():
        return
    from hopdec.runtime import interrupt
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline and interrupt.requested() is None:
        time.sleep(0.05)


def _finish(code, fault_tolerant, reporter=True, stopped=False):
    """The process's exit. Without fault tolerance: return ``code`` (MPI_Finalize follows). With it, the
    process never calls MPI_Finalize -- it waits for dead ranks forever, and with Open MPI 5.0's threaded
    failure detector it hangs even when nobody died -- and since a fault-tolerant launch counts only
    aborts as failures (a dead worker must not fail a job its survivors finished), an error exit
    aborts with its code."""
    if not fault_tolerant:
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    if code and not stopped:
        from mpi4py import MPI
        from hopdec.runtime.failures import OTHERS_S, end_job, forwarded, record_exit
        if reporter:
            forwarded()                     # its line reaches the launcher before the abort
            record_exit(code)
            end_job(MPI.COMM_WORLD, code)
        time.sleep(OTHERS_S)                # the reporting rank's abort ends this one
    else:
        from hopdec.runtime.failures import end_dead_ranks, record_exit
        end_dead_ranks()                    # a stopped dead rank would keep mpirun waiting forever
        if code:
            record_exit(code)               # a clean stop: 128 + signal, which mpirun does not pass on here
        else:
            from hopdec.runtime.failures import record_finished
            record_finished()
    os._exit(code)
