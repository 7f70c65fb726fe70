"""``python -m hopdec.testbed``: hosts and links on this machine, and ``hopdec train`` across them.

    python -m hopdec.testbed check                      # can this machine build a testbed? (root, netns, htb)
    python -m hopdec.testbed run NETWORK -n N -- TRAIN_ARGS...
    python -m hopdec.testbed up NETWORK                 # build it, say how to use it, keep it until Ctrl-C
    python -m hopdec.testbed cleanup                    # remove what a killed testbed left behind

NETWORK (see ``run --help``): ``--place rank`` (one host per rank, the simulator's model) or ``--place
machine`` (one host per machine of the topology's ``machine`` attribute; its ranks share memory and the
host's NIC), ``--nic MBIT``, ``--host-nic HOST=MBIT``, ``--cross MBIT[/MS]`` (links between machines),
``--local MBIT[/MS]``, ``--link A:B=MBIT[/MS]``, or ``--spec FILE`` (JSON, as ``--save-spec`` writes).

``run`` builds the testbed, measures each distinct link (TCP round trip, bulk throughput), prints the
conditions, starts ``launch/hostfile.sh`` on the first host (Open MPI over TCP; an rsh agent that enters
a host's namespace stands in for ssh), waits, and tears everything down -- on success, error, Ctrl-C
or SIGTERM. Ctrl-C once: the run stops cleanly (the launcher's stop: final checkpoint with
``--checkpoint-dir``); twice: hard kill; three times: teardown at once. Every rank's log header has the
conditions (``network``), and the summary says the network was emulated.
"""

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time

from hopdec.errors import ConfigError, TopologyError
from hopdec.testbed.spec import Host, Link, Testbed, by_machine, by_rank, from_json


def _ranks(text):
    """``-n``: a positive number of ranks (0 was taken for "not given": the topology's 8 ran)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of ranks, got {text!r}")
    return n


def parse_link(text, what):
    """``MBIT[/MS]`` (``inf`` or ``-``: unshaped) -> :class:`Link`."""
    bw, _, ms = str(text).partition("/")
    if not bw.strip():          # (--link r0:r1 with no =MBIT left the link unshaped without a word)
        raise ConfigError(f"{what} {text!r}: no bandwidth; expected MBIT[/MS], e.g. 100/5 (inf: unshaped)")
    try:
        mbit = None if bw.strip() in ("inf", "-") else float(bw)
        delay = float(ms) if ms else 0.0
    except ValueError:
        raise ConfigError(f"{what} {text!r}: expected MBIT[/MS], e.g. 100/5 (100 Mbit/s, 5 ms one way)") from None
    if mbit is not None and not math.isfinite(mbit):
        raise ConfigError(f"{what} {text!r}: bandwidth must be finite (or inf for unshaped)")
    return Link(mbit, delay)


def _topology_of(train_args):
    for i, a in enumerate(train_args):
        if a == "--topology" and i + 1 < len(train_args):
            return train_args[i + 1]
        if a.startswith("--topology="):
            return a.split("=", 1)[1]
    return None


def build_spec(args, train_args=()):
    """The :class:`Testbed` the options describe."""
    if args.spec:
        given = [opt for opt, value, default in (
            ("--place", args.place, "rank"), ("--topology", args.topology, None), ("--nic", args.nic, None),
            ("--host-nic", args.host_nic, None), ("--cross", args.cross, None), ("--local", args.local, None),
            ("--link", args.link, None), ("--mtu", args.mtu, 9000)) if value != default]
        if given:       # refused, not ignored: the file describes the whole network
            raise ConfigError(f"{given[0]} is not used with --spec {args.spec} (the file describes the whole "
                              f"network; drop it, or edit the file)")
        from hopdec.files import read_bytes         # a FIFO or /dev/zero is named, never read without end
        raw = read_bytes(args.spec, 1 << 20, "a testbed spec (JSON)", lambda m: ConfigError(f"--spec {m}"))
        return from_json(raw.decode("utf-8", "replace"), f"--spec {args.spec}")
    import networkx as nx
    topo = args.topology or _topology_of(train_args)
    if topo:
        from hopdec.topology import graph_io
        try:
            G = graph_io.load(topo) if os.path.exists(topo) else None
        except TopologyError as err:
            raise ConfigError(str(err)) from None
        if G is None:
            from hopdec.topology import generators
            n = args.n or 8
            if topo not in generators.GENERATORS:
                raise ConfigError(f"--topology {topo}: no such file or generator")
            G = generators.GENERATORS[topo](n, None)
    elif args.n:
        G = nx.DiGraph()
        G.add_nodes_from(range(args.n))
    else:
        raise ConfigError("say how many ranks (-n N), or give a --topology or a --spec")
    cross = parse_link(args.cross, "--cross") if args.cross else Link()
    local = parse_link(args.local, "--local") if args.local else Link()
    if args.place == "machine":
        spec = by_machine(G, args.nic, cross)
    else:
        spec = by_rank(G, args.nic, cross, local)
    hosts = list(spec.hosts)
    for item in args.host_nic or []:
        name, _, mbit = item.partition("=")
        names = [h.name for h in hosts]
        if name not in names:
            raise ConfigError(f"--host-nic {item}: no host {name!r} (hosts: {', '.join(names)})")
        i = names.index(name)
        nic = parse_link(mbit, f"--host-nic {name}")
        if nic.delay_ms:            # (r0=10/5 dropped the /5 without a word)
            raise ConfigError(f"--host-nic {item}: a NIC has a bandwidth, not a delay (give delays with --cross, "
                              f"--local or --link)")
        hosts[i] = Host(name, hosts[i].slots, nic.mbit)
    links = dict(spec.links)
    for item in args.link or []:
        pair, _, value = item.partition("=")
        a, _, b = pair.partition(":")
        links[(a, b)] = parse_link(value, f"--link {pair}")
    return Testbed(tuple(hosts), links, spec.default, args.mtu)


def add_network_options(ap):
    g = ap.add_argument_group("the emulated network")
    g.add_argument("--spec", help="a testbed JSON file (as --save-spec writes); the network options below are "
                                           "then refused (the file describes the whole network)")
    g.add_argument("--place", choices=("rank", "machine"), default="rank",
                   help="one host per rank (default; the simulator's model), or one per machine of the "
                        "topology's `machine` attribute (its ranks share memory and one NIC)")
    g.add_argument("--topology", help="topology for --place and --cross (default: hopdec train's --topology)")
    g.add_argument("--nic", type=float, help="every host's NIC, Mbit/s per direction (default: unshaped)")
    g.add_argument("--host-nic", action="append", metavar="HOST=MBIT",
                   help="one host's NIC, e.g. r0=10 (a thin parameter-server link); repeatable")
    g.add_argument("--cross", metavar="MBIT[/MS]", help="links between machines: bandwidth, one-way delay")
    g.add_argument("--local", metavar="MBIT[/MS]", help="links between ranks of one machine (--place rank)")
    g.add_argument("--link", action="append", metavar="A:B=MBIT[/MS]", help="one directed link; repeatable")
    g.add_argument("--mtu", type=int, default=9000, help="MTU of every emulated interface (default 9000)")
    g.add_argument("--save-spec", metavar="FILE", help="write the testbed description (JSON) to FILE")
    g.add_argument("--no-measure", action="store_true", help="skip measuring the links before the run")


class _Stops:
    """Ctrl-C / SIGTERM / SIGHUP while a launcher runs: 1st and 2nd go to the launcher (its clean stop,
    then its hard kill), the 3rd tears down at once."""

    def __init__(self):
        self.count = 0
        self.proc = None
        self.signal = None

    def __call__(self, signum, frame):
        self.count += 1
        self.signal = self.signal or signum
        if self.proc is not None and self.proc.poll() is None and self.count <= 2:
            what = ("stopping the run cleanly (again: kill it)" if self.count == 1
                    else "killing the run (again: tear down at once)")
            print(f"\ntestbed: {signal.Signals(signum).name}: {what}",
                  file=sys.stderr, flush=True)
            try:
                os.kill(self.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        else:
            raise KeyboardInterrupt


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, train_args = argv[:i], argv[i + 1:]
    from hopdec.cli.helpfmt import Parser       # (one line for a bad option, as every hopdec command)
    ap = Parser(prog="python -m hopdec.testbed", description=__doc__.split("\n\n")[0].replace("``", ""))
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="can this machine build a testbed?")
    sub.add_parser("cleanup", help="remove testbeds whose process is gone")
    run = sub.add_parser("run", help="build, measure, run hopdec train (args after --) across it, tear down",
                         usage="python -m hopdec.testbed run [NETWORK OPTIONS] [-n N] -- [hopdec train options]")
    run.add_argument("-n", type=_ranks, help="MPI ranks (default: the testbed's slots)")
    add_network_options(run)
    up = sub.add_parser("up", help="build it and keep it until Ctrl-C")
    up.add_argument("-n", type=_ranks, help="ranks (with --place rank and no topology)")
    add_network_options(up)
    try:
        args = ap.parse_args(argv)
    except ConfigError as err:
        print(f"hopdec testbed: error: {err}", file=sys.stderr)
        return 2

    from hopdec.testbed import netns
    if args.cmd == "check":
        why = netns.support()
        print("ok: this machine can build testbeds" if why is None else f"no: {why}")
        if why is None and netns.delay_support():
            print(f"note: {netns.delay_support()}")
        return 0 if why is None else 1
    if args.cmd == "cleanup":
        if netns.support() is not None:
            print(f"hopdec testbed: {netns.support()}", file=sys.stderr)
            return 1
        removed = netns.cleanup_stale()
        print(f"{len(removed)} stale testbed(s) removed")
        return 0
    try:
        spec = build_spec(args, train_args)
        if args.cmd == "run" and args.n and args.n != spec.ranks:
            raise ConfigError(f"-n {args.n}: the testbed has {spec.ranks} slots (hosts x ranks per host)")
    except ConfigError as err:
        print(f"hopdec testbed: error: {err}", file=sys.stderr)
        return 2
    if args.save_spec:
        try:
            with open(args.save_spec, "w") as f:
                f.write(spec.to_json() + "\n")
        except OSError as err:      # (a missing folder or a directory was a traceback)
            print(f"hopdec testbed: error: --save-spec {args.save_spec}: cannot write ({err.strerror or err})",
                  file=sys.stderr)
            return 2
    why = netns.support()
    if why is not None:
        print(f"hopdec testbed: error: {why}", file=sys.stderr)
        return 2

    stops = _Stops()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, stops)
    tb = netns.NetnsTestbed(spec, log=lambda line: print(line, flush=True))
    rc = 0
    try:
        tb.up()
        print(spec.describe(), flush=True)
        if not args.no_measure:
            tb.measure()
            print("measured (TCP, one pair per distinct setting):\n" + tb.describe_measured(), flush=True)
        if args.cmd == "up":
            print(f"hosts: {', '.join(tb.ns(i) for i in range(len(spec.hosts)))} (addresses 10.213.<i>.2)\n"
                  f"run a command on host i: ip netns exec {tb.ns(0)} COMMAND\n"
                  f"launch across it: HOPDEC_NETWORK=\"$(cat {tb.conditions_file})\" HOPDEC_INTERFACE={tb.interface} "
                  f"HOPDEC_MPIRUN_ARGS='{tb.mpirun_args()}' "
                  f"ip netns exec {tb.ns(0)} {os.path.join(netns.ROOT, 'launch', 'hostfile.sh')} -f {tb.hostfile} "
                  f"-n {spec.ranks} ...\n"
                  f"Ctrl-C tears it down.", flush=True)
            while True:
                time.sleep(3600)
        env = tb.launch_env()
        print(f"network conditions (in every log header): {json.dumps(tb.conditions())}", flush=True)
        proc = subprocess.Popen(tb.launch_argv(spec.ranks, train_args), env=env, start_new_session=True)
        stops.proc = proc
        while proc.poll() is None:
            try:
                proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        rc = proc.returncode
        # (the launcher got SIGINT, its clean stop, whatever this tool got: SIGTERM exited 130, not 143)
        if stops.count and rc in (0, 128 + signal.SIGINT):
            rc = 128 + stops.signal
    except KeyboardInterrupt:
        rc = 128 + (stops.signal or signal.SIGINT)
    except (ConfigError, netns.TestbedError) as err:
        print(f"hopdec testbed: error: {err}", file=sys.stderr)
        rc = 2
    finally:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)    # the teardown itself is not interrupted
        problems = tb.down()
        print(f"testbed {tb.prefix} torn down" + (f" ({len(problems)} problem(s))" if problems else ""),
              flush=True)
    return rc


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:       # Ctrl-C before the handlers are set (nothing built yet): no traceback
        sys.exit(128 + signal.SIGINT)
