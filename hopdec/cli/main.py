"""The ``hopdec`` command: ``hopdec topo``, ``train``, ``sim``, ``report``, ``plot``, ``trace``.

Every subcommand turns a :class:`hopdec.errors.HopdecError` into one line on stderr and exit 2, and
Ctrl-C into one line and exit 130.
"""

import sys

USAGE = """usage: hopdec {topo,train,sim,report,plot,trace} ...   (hopdec --version: the installed version)

  hopdec topo generate|analyze|compare ...   build and study communication graphs
  hopdec train [options]                      train (run it under mpirun, one worker per rank)
  hopdec sim [options]                        simulate a run in virtual time (any scale, one process)
  hopdec report RUN_DIR... -o report.html     one HTML page comparing runs from their --log-dir
  hopdec plot RUN_DIR... -o out.png           loss curves (or --what gap|consensus|timeline|breakdown)
  hopdec trace RUN_DIR -o trace.json          a Perfetto/Chrome timeline of a run from its logs
"""


COMMANDS = ("topo", "train", "sim", "report", "plot", "trace")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    if argv[0] in ("-V", "--version"):
        from hopdec import __version__
        print(f"hopdec {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    from hopdec.errors import HopdecError
    try:
        if cmd == "topo":
            from hopdec.cli.topo import main as run
        elif cmd == "train":
            from hopdec.cli.train import main as run
        elif cmd == "sim":
            from hopdec.cli.sim import main as run
        elif cmd in ("report", "plot", "trace"):
            from hopdec.cli import report
            run = getattr(report, f"{cmd}_main")
        else:
            from hopdec.errors import did_you_mean
            print(f"hopdec: unknown command {cmd!r} (expected topo, train, sim, report, plot or trace)"
                  f"{did_you_mean(cmd, COMMANDS, cutoff=0.6)}",
                  file=sys.stderr)
            return 2
        return run(rest) or 0
    except HopdecError as err:
        print(f"hopdec {cmd}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:                 # `hopdec topo analyze ... | head`: the reader has what it wanted
        _quiet_stdout()
        return 128 + 13                     # as a process SIGPIPE ended: 141
    except KeyboardInterrupt:               # Ctrl-C on a long topo generate/analyze, report or plot: one
        print(f"hopdec {cmd}: stopped by SIGINT", file=sys.stderr, flush=True)     # line, not a traceback
        return 128 + 2                      # as a shell reports a process SIGINT ended: 130


def _quiet_stdout():
    """After a broken pipe: stdout to /dev/null, so the interpreter's final flush does not raise again."""
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
