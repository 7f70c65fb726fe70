"""Build a :class:`~hopdec.testbed.spec.Testbed` on this machine: network namespaces as hosts, veth links
to a router namespace, ``htb`` for bandwidth, a TUN forwarder for delay; and tear it all down.

Layout (why a router, not a bridge: a router sees every packet at layer 3, so per host pair it can
shape and delay by the addresses in the packet -- policy routing into the delay forwarder, ``u32``
filters on addresses -- where a bridge would need per-port MAC bookkeeping; and a host's uplink and
downlink are two interfaces on two sides, so both directions of a NIC are shaped on egress, where
``htb`` works)::

    host i (netns PREFIX-NAME)                      router (netns PREFIX-rt)
    eth0 10.213.i.2/24  ----- veth -----  hI 10.213.i.1/24     [dly: TUN, delay forwarder]

* **Sender NIC and links** (host egress, ``eth0``): an ``htb`` class at the NIC's rate; under it one
  class per destination host (ceil: the link's capacity, if it has one), and a default class for the
  rest. Children borrow equally (same quantum, one jumbo frame): transfers to different hosts share the
  NIC equally, as in the simulator and as Linux's default ``fq_codel`` shares a NIC between flows (one
  FIFO would let the first message queued finish first).
* **Packets**: jumbo frames (MTU 9000) and segmentation offload limited to one MTU (``gso_max_size``),
  so the flows sharing a NIC interleave packet by packet, as the flows of large messages do on real
  hosts. (With offload, Linux hands a NIC up to 64 KB of one flow at once: messages below that size --
  the mlp's 38 KB -- then leave whole, one after another, and the first receiver of a fan-out gets its
  message after 1/n of the time, the last after all of it; the simulator shares the NIC instead.)
* **Receiver NIC** (router egress towards host j, ``hJ``): an ``htb`` class at host j's NIC rate, one
  child per source host (equal shares of the downlink).
* **Delay**: the router's policy rules send the packets of every delayed (source, destination) pair to
  the TUN device ``dly``; :mod:`hopdec.testbed.delay` holds each for the pair's one-way delay.

Nothing is created outside the namespaces the testbed made (no address, route or qdisc in the root
namespace); state files go to a directory of its own under ``/tmp``. :meth:`NetnsTestbed.down` kills the
processes left in those namespaces (ranks, Open MPI daemons: processes this testbed started), stops the
forwarder and deletes the namespaces; :func:`cleanup_stale` removes what a killed testbed left behind.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from hopdec.errors import ConfigError

PREFIX = "hdtb"
"""Every namespace a testbed makes is named ``hdtb<id>-...``; :func:`cleanup_stale` looks for these."""
NET = "10.213"
"""Host i has 10.213.i.2/24 inside its namespace (the router 10.213.i.1); nothing outside them."""
STATE_ROOT = os.path.join(tempfile.gettempdir(), "hopdec-testbed")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class TestbedError(RuntimeError):
    """A command that builds the testbed failed (the message has the command and its error)."""


def support():
    """``None`` when this machine can build a testbed, else why not (one line)."""
    if os.name != "posix" or not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"the `{tool}` command is missing (iproute2 / util-linux)"
    name = f"hdtp-probe{os.getpid()}"     # (not PREFIX: cleanup_stale must not take it)
    try:
        _run(["ip", "netns", "add", name])
    except TestbedError as err:
        return f"cannot create a network namespace here ({err})"
    try:
        _run(["ip", "-n", name, "link", "add", "a0", "type", "veth", "peer", "name", "a1"])
        _run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "a0", "root", "handle", "1:", "htb"])
    except TestbedError as err:
        return f"veth links or the htb qdisc are not available ({err})"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def delay_support():
    """``None`` when link delays can be emulated (a TUN device can be opened), else why not."""
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing: links cannot be delayed (bandwidth still works)"
    return None


def _run(argv, input=None, check=True, timeout=30):
    p = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode:
        raise TestbedError(f"{shlex.join(argv)}: {(p.stderr or p.stdout).strip() or f'exit {p.returncode}'}")
    return p


def _bit(mbit):
    return f"{int(round(mbit * 1e6))}bit"


def _burst(mbit, mtu):
    """htb burst of a NIC: two packets, or 1 ms at the rate (its timer cannot send smaller bursts fast
    enough). Its children (links, destinations) get one packet: they borrow everything from the NIC (a
    child's own tokens would let a first burst past the NIC's rate)."""
    return f"{max(2 * (mtu + 100), int(mbit * 1e6 / 8 * 0.001))}b"


UNSHAPED_MBIT = 100_000.0
"""The rate of an "unshaped" NIC under which some links are shaped (faster than anything here)."""


def probe_limit(what, rtt_count, bulk_s, rtt_s):
    """Seconds a link measurement may take: a minute, plus the round trips it makes at the link's round-trip
    time ``rtt_s`` (``rtt``: ``rtt_count`` and the connection's; ``bulk``: the connection's and TCP's slow
    start). A fixed 61.5 s ran out at a one-way delay over 1.5 s, which a link may have (up to 10 s): a
    traceback, and no run."""
    return 60 + bulk_s + (rtt_count + 2 if what == "rtt" else 8) * rtt_s


class NetnsTestbed:
    """A testbed on this machine. ``with NetnsTestbed(spec) as tb: tb.launch(...)``; or ``up()``/``down()``.

    ``log``: where progress lines go (``None``: quiet)."""

    def __init__(self, spec, log=None, tag=None):
        self.spec = spec
        self.log = log
        self.id = tag or f"{os.getpid() % 100000}{int(time.time() * 1000) % 1000:03d}"
        self.prefix = f"{PREFIX}{self.id}"
        self.router = f"{self.prefix}-rt"
        self.state = os.path.join(STATE_ROOT, self.prefix)
        self.made = []                  # namespaces created, in order
        self.forwarder = None           # the delay forwarder's Popen
        self.measured = None
        self._down = False

    # ---- names ----
    def ns(self, host):
        """Namespace (and host name inside it) of host ``host`` (index or name)."""
        h = self.spec.hosts[host] if isinstance(host, int) else self.spec.hosts[self.spec.index(host)]
        return f"{self.prefix}-{h.name}"

    def address(self, i):
        return f"{NET}.{i}.2"

    # ---- building ----
    def up(self):
        """Create every namespace, link, shaping rule and the delay forwarder. On any failure what was
        made is torn down again and the error raised."""
        spec = self.spec
        if spec.delays() and delay_support():
            raise ConfigError(delay_support())
        # testbeds whose process was killed (SIGKILL: no clean-up ran) go first, so they do not pile up
        # until someone runs `python -m hopdec.testbed cleanup`; one with no owner file may be being built
        cleanup_stale(log=self._say, unowned=False, own=False)
        os.makedirs(self.state, exist_ok=True)
        with open(os.path.join(self.state, "owner"), "w") as f:
            f.write(str(os.getpid()))
        with open(os.path.join(self.state, "testbed.json"), "w") as f:
            f.write(spec.to_json())
        try:
            self._say(f"testbed {self.prefix}: {len(spec.hosts)} host(s), router {self.router}")
            self._netns(self.router)
            self._ip(self.router, "link", "set", "lo", "up")
            self._in(self.router, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                     "net.ipv4.conf.default.rp_filter=0")
            for i, h in enumerate(spec.hosts):
                ns = self.ns(i)
                self._netns(ns)
                self._ip(ns, "link", "set", "lo", "up")
                _run(["ip", "link", "add", "eth0", "netns", ns, "mtu", str(spec.mtu), "type", "veth", "peer",
                      "name", f"h{i}", "netns", self.router, "mtu", str(spec.mtu)])
                self._ip(ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                self._ip(self.router, "addr", "add", f"{NET}.{i}.1/24", "dev", f"h{i}")
                # packets of one MTU at most (no segmentation offload in bigger units): see the module doc
                self._ip(ns, "link", "set", "eth0", "gso_max_size", str(spec.mtu), "up")
                self._ip(self.router, "link", "set", f"h{i}", "gso_max_size", str(spec.mtu), "up")
                self._ip(ns, "route", "add", "default", "via", f"{NET}.{i}.1")
            for i in range(len(spec.hosts)):
                self._shape_uplink(i)
                self._shape_downlink(i)
            if spec.delays():
                self._start_delays()
            self._write_launch_files()
        except BaseException:
            self.down()
            raise
        return self

    def _shape_uplink(self, i):
        """Host i's egress: its NIC, and under it the links it has to other hosts."""
        spec, ns = self.spec, self.ns(i)
        nic = spec.hosts[i].nic_mbit
        shaped = {j: spec.link(i, j).mbit for j in range(len(spec.hosts))
                  if j != i and spec.link(i, j).mbit is not None}
        if nic is None and not shaped:
            return
        # a class per destination host, shaped link or not: the NIC is shared fairly between them (as
        # Linux's default fq_codel shares a NIC between flows), not first come first served
        shaped = {j: shaped.get(j, UNSHAPED_MBIT) for j in range(len(spec.hosts)) if j != i}
        top = nic if nic is not None else UNSHAPED_MBIT
        q = str(spec.mtu + 100)
        tc = ["tc"]
        self._in(ns, *tc, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "2")
        self._in(ns, *tc, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb",
                 "rate", _bit(top), "ceil", _bit(top), "burst", _burst(top, spec.mtu), "quantum", q)
        self._in(ns, *tc, "class", "add", "dev", "eth0", "parent", "1:1", "classid", "1:2", "htb",
                 "rate", "8kbit", "ceil", _bit(top), "burst", q, "quantum", q)
        for j, mbit in sorted(shaped.items()):
            cap = min(mbit, top)
            self._in(ns, *tc, "class", "add", "dev", "eth0", "parent", "1:1", "classid", f"1:{100 + j:x}", "htb",
                     "rate", "8kbit", "ceil", _bit(cap), "burst", q, "quantum", q)
            self._in(ns, *tc, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1",
                     "u32", "match", "ip", "dst", f"{NET}.{j}.0/24", "flowid", f"1:{100 + j:x}")

    def _shape_downlink(self, j):
        """The router's egress towards host j: host j's NIC, an equal share per sending host."""
        spec = self.spec
        nic = spec.hosts[j].nic_mbit
        if nic is None:
            return
        dev, q = f"h{j}", str(spec.mtu + 100)
        r = self.router
        self._in(r, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "2")
        self._in(r, "tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                 "rate", _bit(nic), "ceil", _bit(nic), "burst", _burst(nic, spec.mtu), "quantum", q)
        self._in(r, "tc", "class", "add", "dev", dev, "parent", "1:1", "classid", "1:2", "htb",
                 "rate", "8kbit", "ceil", _bit(nic), "burst", q, "quantum", q)
        for i in range(len(spec.hosts)):
            if i == j:
                continue
            self._in(r, "tc", "class", "add", "dev", dev, "parent", "1:1", "classid", f"1:{100 + i:x}", "htb",
                     "rate", "8kbit", "ceil", _bit(nic), "burst", q, "quantum", q)
            self._in(r, "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
                     "u32", "match", "ip", "src", f"{NET}.{i}.0/24", "flowid", f"1:{100 + i:x}")

    def _start_delays(self):
        """The TUN forwarder in the router, and the rules that route the delayed pairs through it."""
        spec, r = self.spec, self.router
        pairs = ",".join(f"{i}:{j}:{s!r}" for i, j, s in spec.delays())
        argv = ["ip", "netns", "exec", r, sys.executable, "-m", "hopdec.testbed.delay", "dly", NET, pairs]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.forwarder = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=env, start_new_session=True)
        line = self.forwarder.stdout.readline().strip()
        if line != "ready":
            err = self.forwarder.stderr.read() if self.forwarder.poll() is not None else ""
            raise TestbedError(f"the delay forwarder did not start: {line} {err.strip()}")
        with open(os.path.join(self.state, "forwarder.pid"), "w") as f:
            f.write(str(self.forwarder.pid))
        self._ip(r, "link", "set", "dly", "up", "mtu", str(spec.mtu))
        self._in(r, "sysctl", "-qw", "net.ipv4.conf.dly.rp_filter=0")
        self._ip(r, "route", "add", "default", "dev", "dly", "table", "100")
        self._ip(r, "rule", "add", "pref", "100", "iif", "dly", "lookup", "main")
        for i, j, _ in spec.delays():
            self._ip(r, "rule", "add", "pref", "200", "from", f"{NET}.{i}.0/24", "to", f"{NET}.{j}.0/24",
                     "lookup", "100")

    def _write_launch_files(self):
        """The Open MPI hostfile (one line per host, its slots) and the rsh agent that stands in for ssh:
        it enters the host's namespace (and a UTS namespace named after it) and runs the command there."""
        with open(self.hostfile, "w") as f:
            for i, h in enumerate(self.spec.hosts):
                f.write(f"{self.ns(i)} slots={h.slots}\n")
        cases = "\n".join(f"    {self.ns(i)}) ;;" for i in range(len(self.spec.hosts)))
        with open(self.agent, "w") as f:
            f.write(f"""#!/bin/sh
# rsh agent of hopdec testbed {self.prefix} (Open MPI's plm_rsh_agent; stands in for ssh):
#   agent [-options] HOST COMMAND...  runs COMMAND with sh in HOST's network namespace, as ssh would.
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host="$1"; shift
case "$host" in
{cases}
    *) echo "testbed rsh agent: no host $host in testbed {self.prefix}" >&2; exit 255 ;;
esac
exec ip netns exec "$host" unshare --uts /bin/sh -c 'hostname "$1" && exec /bin/sh -c "$2"' sh "$host" "$*"
""")
        os.chmod(self.agent, 0o755)
        self._write_conditions()

    @property
    def hostfile(self):
        return os.path.join(self.state, "hostfile")

    @property
    def agent(self):
        return os.path.join(self.state, "rsh-agent")

    # ---- running things inside ----
    def exec_argv(self, host, argv):
        """``argv`` as run on host ``host``: in its network namespace, with its host name."""
        ns = self.ns(host)
        return ["ip", "netns", "exec", ns, "unshare", "--uts", "/bin/sh", "-c",
                'hostname "$1" && shift && exec "$@"', "sh", ns] + list(argv)

    def mpirun_args(self):
        """What ``HOPDEC_MPIRUN_ARGS`` gives ``launch/hostfile.sh`` to run inside the testbed: the rsh agent
        (:meth:`launch_env` adds ``HOPDEC_INTERFACE``: TCP only over the testbed's addresses, see
        launch/README.md, and ``HOPDEC_NETWORK``, which hostfile.sh passes on to the ranks when it is set).
        No ``-x HOPDEC_NETWORK`` here: where the variable was not set, that made Open MPI print a box on every
        launch ("Could not find the environment variable")."""
        return f"--mca plm_rsh_agent {self.agent}"

    @property
    def conditions_file(self):
        """The conditions as JSON (:meth:`conditions`; with what was measured once it was), for
        ``HOPDEC_NETWORK="$(cat FILE)"``."""
        return os.path.join(self.state, "conditions.json")

    def _write_conditions(self):
        with open(self.conditions_file, "w") as f:
            json.dump(self.conditions(), f, separators=(",", ":"))

    @property
    def interface(self):
        """The testbed's addresses, as ``HOPDEC_INTERFACE`` gives them to the launch scripts."""
        return f"{NET}.0.0/16"

    def conditions(self):
        """The spec's conditions plus this instance's names and what was measured."""
        from hopdec.launcher import network_text
        c = dict(self.spec.conditions(), testbed=self.prefix)
        if self.measured is not None:
            c["measured"] = self.measured
        c["described"] = network_text(c)            # (with the testbed's name)
        return c

    def launch_env(self, env=None):
        env = dict(os.environ if env is None else env)
        env["HOPDEC_MPIRUN_ARGS"] = (self.mpirun_args() + " " + env.get("HOPDEC_MPIRUN_ARGS", "")).strip()
        env["HOPDEC_NETWORK"] = json.dumps(self.conditions(), separators=(",", ":"))
        env["HOPDEC_INTERFACE"] = self.interface    # launch/hostfile.sh keeps ranks and daemons on it
        return env

    def launch_argv(self, n, train_args, map_by="slot"):
        """``launch/hostfile.sh -f HOSTFILE -n N -m MAP TRAIN_ARGS...`` run on host 0 (where ``mpirun`` runs,
        as on a cluster's first node)."""
        return self.exec_argv(0, [os.path.join(ROOT, "launch", "hostfile.sh"), "-f", self.hostfile, "-n", str(n),
                                  "-m", map_by, "--"] + list(train_args))

    def run(self, n, train_args=(), cmd=None, timeout=None, env=None):
        """Run ``launch/hostfile.sh`` across the testbed and wait (``cmd``: ``HOPDEC_CMD``, another program
        on every rank); returns the CompletedProcess (output captured). On a timeout the launcher is
        killed and ``subprocess.TimeoutExpired`` raised; :meth:`down` kills what is left."""
        env = self.launch_env(env)
        if cmd is not None:
            env["HOPDEC_CMD"] = cmd
        return subprocess.run(self.launch_argv(n, train_args), env=env, capture_output=True, text=True,
                              timeout=timeout)

    # ---- measuring ----
    def measure(self, pairs=None, rtt_count=20, bulk_s=1.5):
        """Round trip and throughput of host pairs (default: one pair per distinct link setting, plus every
        host's NIC when it is the limit). Returns a list of dicts, also kept in ``self.measured``."""
        spec = self.spec
        n = len(spec.hosts)
        if pairs is None:
            seen, pairs = set(), []
            for i in range(n):
                for j in range(n):
                    if i == j:
                        continue
                    key = (spec.link(i, j), spec.hosts[i].nic_mbit, spec.hosts[j].nic_mbit)
                    if key not in seen:
                        seen.add(key)
                        pairs.append((i, j))
        out = []
        for i, j in pairs:
            port = 5301
            env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
            srv = subprocess.Popen(self.exec_argv(j, [sys.executable, "-m", "hopdec.testbed.probe", "serve",
                                                      self.address(j), str(port), "2"]),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            try:
                if srv.stdout.readline().strip() != "ready":
                    raise TestbedError(f"probe server on {spec.hosts[j].name} did not start: {srv.stderr.read()}")
                res = {"src": spec.hosts[i].name, "dst": spec.hosts[j].name}
                rtt_s = (spec.link(i, j).delay_ms + spec.link(j, i).delay_ms) / 1e3
                for what, extra in (("rtt", str(rtt_count)), ("bulk", str(bulk_s))):
                    limit = probe_limit(what, rtt_count, bulk_s, rtt_s)
                    try:
                        p = _run(self.exec_argv(i, [sys.executable, "-m", "hopdec.testbed.probe", what,
                                                    self.address(j), str(port), extra]), timeout=limit)
                    except subprocess.TimeoutExpired:
                        raise TestbedError(f"measuring {res['src']}->{res['dst']} ({what}) took over {limit:.0f} "
                                           f"s; --no-measure skips it") from None
                    res.update(json.loads(p.stdout))
                lk = spec.link(i, j)
                caps = [x for x in (lk.mbit, spec.hosts[i].nic_mbit, spec.hosts[j].nic_mbit) if x is not None]
                res["configured"] = {"mbit": min(caps) if caps else None, "delay_ms": lk.delay_ms,
                                     "rtt_ms": lk.delay_ms + spec.link(j, i).delay_ms}
                out.append(res)
            finally:
                try:
                    srv.wait(timeout=30 + 4 * (spec.link(i, j).delay_ms + spec.link(j, i).delay_ms) / 1e3)
                except subprocess.TimeoutExpired:
                    srv.kill()
                    srv.wait()
        self.measured = out
        self._write_conditions()
        return out

    def describe_measured(self):
        lines = []
        for m in self.measured or []:
            c = m["configured"]
            bw = "unshaped" if c["mbit"] is None else f"{c['mbit']:g}"
            lines.append(f"  {m['src']}->{m['dst']}: configured {bw} Mbit/s, RTT {c['rtt_ms']:g} ms; measured "
                         f"{m['mbit']:.1f} Mbit/s, RTT min/median/max {m['rtt_ms_min']:.2f}/"
                         f"{m['rtt_ms_median']:.2f}/{m['rtt_ms_max']:.2f} ms")
        return "\n".join(lines)

    # ---- teardown ----
    def down(self):
        """Kill what runs in the testbed's namespaces, stop the forwarder, delete the namespaces and the
        state directory. Safe to call twice; never raises (what it could not remove is reported)."""
        if self._down:
            return []
        self._down = True
        problems = teardown(self.prefix, forwarder=self.forwarder)
        for p in problems:
            self._say(f"testbed {self.prefix}: teardown: {p}")
        return problems

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()
        return False

    # ---- helpers ----
    def _netns(self, name):
        _run(["ip", "netns", "add", name])
        self.made.append(name)

    def _ip(self, ns, *args):
        return _run(["ip", "-n", ns] + list(args))

    def _in(self, ns, *argv):
        return _run(["ip", "netns", "exec", ns] + list(argv))

    def _say(self, line):
        if self.log is not None:
            self.log(line)


def namespaces(prefix=PREFIX):
    """The network namespaces whose names start with ``prefix``."""
    p = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in p.stdout.splitlines() if line.split() and line.split()[0].startswith(prefix)]


def teardown(prefix, forwarder=None, grace=3.0):
    """Remove testbed ``prefix`` (``hdtb<id>``): processes in its namespaces (SIGTERM, then SIGKILL after
    ``grace`` s), the forwarder, the namespaces, the state directory. Returns what could not be removed."""
    problems = []
    mine = [ns for ns in namespaces() if ns == prefix or ns.startswith(prefix + "-")]
    pids = set()
    for ns in mine:
        p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        pids |= {int(x) for x in p.stdout.split() if x.isdigit()}
    state = os.path.join(STATE_ROOT, prefix)
    # (the delay forwarder lives in the router namespace: it is among `pids` while it runs)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p in pids if _alive(p)]
        for p in live:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
        while time.monotonic() < deadline and any(_alive(p) for p in live):
            time.sleep(0.05)
    if forwarder is not None:
        try:
            forwarder.wait(timeout=2)
        except subprocess.TimeoutExpired:
            problems.append(f"delay forwarder pid {forwarder.pid} did not exit")
    for p in pids:
        if _alive(p):
            problems.append(f"process {p} did not exit")
    for ns in sorted(mine, key=lambda x: x.endswith("-rt")):
        r = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
        if r.returncode:
            problems.append(f"ip netns del {ns}: {r.stderr.strip()}")
    shutil.rmtree(state, ignore_errors=True)
    return problems


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:                                # a zombie child of ours is as good as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cleanup_stale(log=print, unowned=True, own=True):
    """Tear down every testbed whose owner process is gone (left behind by a killed testbed). The
    ``cleanup`` command, run by hand, also takes those without an owner file (``unowned``: a testbed being
    built has none for a moment) and those naming this process (``own``: a dead one had its pid); a
    testbed being built (:meth:`NetnsTestbed.up`) leaves both alone."""
    prefixes = {ns.split("-")[0] for ns in namespaces()}
    if os.path.isdir(STATE_ROOT):
        prefixes |= {d for d in os.listdir(STATE_ROOT) if d.startswith(PREFIX)}
    removed = []
    for prefix in sorted(prefixes):
        try:
            with open(os.path.join(STATE_ROOT, prefix, "owner")) as f:
                owner = int(f.read().strip())
        except (OSError, ValueError):
            owner = None
        keep = (not unowned if owner is None else not own if owner == os.getpid() else _alive(owner))
        if keep:
            continue
        problems = teardown(prefix)
        removed.append(prefix)
        if log is not None:
            log(f"removed stale testbed {prefix}" + (f" ({'; '.join(problems)})" if problems else ""))
    return removed
