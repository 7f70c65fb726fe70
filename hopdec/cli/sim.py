"""``hopdec sim``: the same run as ``hopdec train``, simulated in virtual time in one process.

The same protocol cores and loops as a real run, driven by a discrete-event simulator with a cost
model (compute time per iteration, message size, NIC bandwidth shared by concurrent transfers,
latency), so a run at thousands of workers or on a cluster you do not have takes seconds. Timing only
by default (no tensors); ``--math`` gives every worker a real replica of the model. The logs and the
summary are a real run's, with times in virtual seconds and labelled SIMULATED.
"""

import argparse
import os
import signal
import sys
import threading
import traceback
from contextlib import contextmanager

from hopdec.errors import HopdecError

EXAMPLES = """examples:
  hopdec sim --topology ring-based -n 64 --iterations 2000 --message-mb 528 --bandwidth 10 \\
      --compute-time 0.25 --slowdown random:factor=6,prob=1/n --backup-workers 1 --log-dir runs/sim_b1
  hopdec sim --mode ps --sync dssp -n 16 --compute-time normal:mean=0.25,std=0.02 --slowdown rank=3,factor=4
  hopdec sim --topology topologies/ring_based_8.json --math --iterations 300 --eval-interval 5
  hopdec sim --topology ring-based -n 1024 --iterations 100 --fault-tolerance --churn-mttf 1000 --seed 1
"""


def build_parser():
    from hopdec.cli.options import add_network_arguments, add_run_arguments
    from hopdec.cli.train import _Parser
    from hopdec.settings.cost import CHECK_UP_TO
    from hopdec.settings.faults import DETECT_S, HEAL_STALL_S
    from hopdec.sim.costs import DEFAULT_COMPUTE_S

    p = _Parser(prog="hopdec sim", description=__doc__.splitlines()[0].replace("``", ""), epilog=EXAMPLES,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = add_run_arguments(p, mpi=False)
    p.add_argument("-n", "--workers", type=int, default=None,
                   help="number of workers (default: the topology file's; --mode ps: required, the "
                        "server is rank 0 and the workers ranks 1..n)")
    groups["heterogeneity"].add_argument(
        "--compute-time", action="append", default=None, metavar="[WHO@]DIST", dest="sim_compute_time",
        help=f"virtual seconds per iteration (repeatable): a number, normal:mean=M,std=S or "
             f"uniform:low=A,high=B, for every worker or, with WHO@, for ranks WHO (3, 0-7, 1,4,9-12); "
             f"default {DEFAULT_COMPUTE_S:g}. --slowdown multiplies it as in a real run")
    for action in p._actions:                   # the same option, in virtual time here
        if action.dest == "eval_interval":
            action.help = ("--math: evaluate every SECONDS of virtual time (decentralized: the average of "
                           "all workers' parameters, DIR/eval.jsonl; --mode ps: the server's model, eval "
                           "events in rank0.jsonl); a time with nothing new since the last is skipped; "
                           "0: only at the end")
    c = p.add_argument_group("cost model (simulator)")
    c.add_argument("--math", action="store_true",
                   help="every worker holds a real replica of the model and really trains (time stays "
                        "virtual); default: timing only, no tensors")
    c.add_argument("--message-mb", type=float, default=None, metavar="MIB",
                   help="size of a parameter (or gradient) message in MiB (2^20 bytes; 0.5 for 512 KiB); "
                        "default: the model's real size (parameters x 4 bytes)")
    add_network_arguments(c)
    c.add_argument("--send-path", choices=["zero-copy", "copy"], default="zero-copy",
                   help="decentralized mode: zero-copy (a real CPU run's): the parameters live in a pool of "
                        "stores; a Reduce writes one whose sends completed -- above the eager limit, once a "
                        "computing receiver finished its compute -- or a new one, and waits only with "
                        "max_ig + 2 stores busy; copy (a GPU model without CUDA-aware MPI): never waits")
    c.add_argument("--eager-limit", type=float, default=None, metavar="BYTES",
                   help="messages up to BYTES travel and complete at once (default 65536, Open MPI over "
                        "TCP; 4096 over shared memory, one host)")
    c.add_argument("--rendezvous", choices=["take", "push"], default="take",
                   help="how larger messages move: take: a receiver takes one once it has arrived and it is "
                        "not computing (shared memory); push: the receiver acknowledges when it is not "
                        "computing, then the sender sends the data when it is not (TCP)")
    c.add_argument("--invariants", choices=["auto", "on", "off"], default="auto",
                   help=f"check the Hop invariants (PS: the sync model's gap bound) after every event; "
                        f"auto: on up to {CHECK_UP_TO} workers (the check is O(n^2))")
    f = p.add_argument_group("failures (simulated: worker deaths replayed through the heal code of "
                             "hopdec train --fault-tolerance)")
    f.add_argument("--fault-tolerance", action="store_true",
                   help="the survivors of a death heal the graph and go on, as hopdec train --fault-tolerance "
                        "(needs --protocol tokens; --mode ps: the server drops the dead worker)")
    f.add_argument("--deaths", action="append", default=None, metavar="W@T[,W@T...]",
                   help="worker W dies at virtual second T (repeatable)")
    f.add_argument("--death-trace", default=None, metavar="FILE",
                   help="deaths from a file: one 'SECONDS WORKER' per line ('#' comments)")
    f.add_argument("--churn-mttf", type=float, default=None, metavar="SECONDS",
                   help="churn: every worker dies after an exponential lifetime of this mean (drawn from --seed)")
    f.add_argument("--failure-detection", type=float, default=DETECT_S, metavar="SECONDS", dest="detect_s",
                   help=f"virtual seconds from a death until the survivors start healing (--mode ps: until the "
                        f"server drops the worker) (default {DETECT_S:g}: a crash over TCP, measured; a hang is "
                        f"found after ULFM's detector timeout, 30)")
    f.add_argument("--heal-stall", type=float, default=HEAL_STALL_S, metavar="SECONDS", dest="heal_stall_s",
                   help=f"virtual seconds the survivors' recovery takes once all joined it (default "
                        f"{HEAL_STALL_S:g}: measured on 8 workers; decentralized only: a PS run has no recovery)")
    return p


def parse(argv):
    """The settings of ``hopdec sim ARGV`` (:class:`hopdec.settings.RunSettings` with a cost model);
    ConfigError (one line naming the option) for anything the options alone show is wrong."""
    from hopdec.cli.options import settings_from
    return settings_from(build_parser().parse_args(argv), argv, simulated=True)


@contextmanager
def _stop_signals():
    """Ctrl-C and SIGTERM (a batch system's stop, ``kill``) raise KeyboardInterrupt inside, so a long
    simulation ends as Ctrl-C ends it, with its records written (SIGTERM killed it on the spot and lost
    them); yields the signals received. A signal ignored when we started (a background job's SIGINT) stays
    ignored; the handlers before are restored after."""
    got = []

    def stop(signum, frame):
        got.append(signum)
        raise KeyboardInterrupt
    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) in (signal.default_int_handler, signal.SIG_DFL):
                old[sig] = signal.signal(sig, stop)
    try:
        yield got
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def main(argv):
    from hopdec.sim.run import Stopped, simulate
    with _stop_signals() as got:
        try:
            simulate(parse(argv))
        except HopdecError as err:
            print(f"hopdec sim: error: {err}", file=sys.stderr, flush=True)
            return 2
        except (Stopped, KeyboardInterrupt) as stop:      # one line, exit 128 + the signal, as a shell's
            sig = got[0] if got else signal.SIGINT
            print(f"hopdec sim: stopped by {signal.Signals(sig).name}"
                  + (f" {stop}" if isinstance(stop, Stopped) else " (no summary)"), file=sys.stderr, flush=True)
            return 128 + int(sig)
        except Exception as err:        # a user's model or data failing mid-run: one line, as hopdec train's
            from hopdec.runtime.failures import cause
            if os.environ.get("HOPDEC_DEBUG"):
                traceback.print_exc()
            print(f"hopdec sim: error: {cause(err)}", file=sys.stderr, flush=True)
            return 1
    return 0
