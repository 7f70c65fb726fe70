"""How long ``hopdec topo generate`` takes, and reading what it wrote (goal: 100,000 nodes in < 30 s).

    python3 experiments/bench_generate.py [--sizes 100000] [--kinds ring,one-peer-exponential,...]
                                          [--weights hop,metropolis] [--load] [--analyze] [--sim]

Each case is the command a user runs, in a fresh process: ``hopdec topo generate KIND -n N -o FILE``
(``--weights metropolis`` too where the kind takes it), then, with ``--load``, ``hopdec.topology.load(FILE)``
(what ``train`` and ``sim`` do first), with ``--analyze`` ``hopdec topo analyze FILE --json``, with
``--sim`` ``hopdec sim --topology FILE --iterations 1`` (timing only: the whole start of a run -- load,
the protocol's node views -- and one iteration). Prints wall and CPU seconds and the peak memory of each, the
file's size and the first 12 hex digits of its sha256 (which must not change when only the speed does).
The kinds that are refused at a size (``complete``, ``hierarchical-*`` beyond this host's memory) print
the first line of their refusal. The load average is printed before and after: this machine is shared,
and under load the wall time is mostly waiting for a core, so the CPU time is the figure to compare.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
KINDS = ("ring", "ring-based", "double-ring", "exponential", "torus", "complete", "hierarchical-a",
         "hierarchical-b", "one-peer-exponential")
SYMMETRIC = ("ring", "ring-based", "double-ring", "torus", "complete", "hierarchical-a", "hierarchical-b")
"""The kinds ``--weights metropolis`` applies to (symmetric graphs)."""


def run(cmd, timeout):
    """``(wall s, CPU s, peak MiB, returncode, output)`` of ``cmd`` in a fresh process (its own rusage)."""
    with tempfile.TemporaryFile("w+") as log:
        t0, killed = time.perf_counter(), False
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                p.kill()
                _, status, ru = os.wait4(p.pid, 0)
                killed = True
                break
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        out = f"timed out after {timeout:.0f} s" if killed else log.read()
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, p.returncode, out


def row(what, wall, cpu, peak, rc, out, extra=""):
    tail = "" if rc == 0 else "  " + (out.strip().splitlines() or ["?"])[-1][:110]
    print(f"{what:<52}{wall:>8.1f}{cpu:>8.1f}{peak:>9.0f}  {extra}{tail}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100000")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--weights", default="hop,metropolis", help="hop, metropolis or both (symmetric kinds)")
    p.add_argument("--load", action="store_true", help="time hopdec.topology.load of each file")
    p.add_argument("--analyze", action="store_true", help="time hopdec topo analyze FILE --json")
    p.add_argument("--sim", action="store_true", help="time hopdec sim --topology FILE --iterations 1")
    p.add_argument("--timeout", type=float, default=900, help="seconds before a command is given up")
    a = p.parse_args(argv)
    py = sys.executable
    print(f"load average {os.getloadavg()[0]:.1f}  (python {sys.version.split()[0]}, {ROOT})")
    print(f"{'command':<52}{'wall s':>8}{'CPU s':>8}{'peak MiB':>9}  file")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in a.sizes.split(",")):
            for kind in a.kinds.split(","):
                for weights in a.weights.split(","):
                    if weights == "metropolis" and kind not in SYMMETRIC:
                        continue
                    path = os.path.join(tmp, f"{kind}_{n}_{weights}.json")
                    cmd = [py, "-m", "hopdec.cli", "topo", "generate", kind, "-n", str(n), "-o", path]
                    cmd += ["--weights", weights] if weights != "hop" else []
                    wall, cpu, peak, rc, out = run(cmd, a.timeout)
                    info = ""
                    if rc == 0:
                        with open(path, "rb") as fh:
                            digest = hashlib.sha256(fh.read()).hexdigest()[:12]
                        info = f"{os.path.getsize(path) / 2 ** 20:.1f} MiB, sha256 {digest}"
                    name = f"generate {kind} -n {n}" + (" --weights metropolis" if weights != "hop" else "")
                    row(name, wall, cpu, peak, rc, out, info)
                    if rc != 0:
                        continue
                    if a.load:
                        code = f"from hopdec import topology as T; T.load({path!r})"
                        row("  load", *run([py, "-c", code], a.timeout))
                    if a.analyze:
                        row("  analyze --json", *run([py, "-m", "hopdec.cli", "topo", "analyze", path, "--json"],
                                                     a.timeout))
                    if a.sim:
                        row("  sim --iterations 1",
                            *run([py, "-m", "hopdec.cli", "sim", "--topology", path, "--iterations",
                                  "1", "--no-progress", "--log-dir", os.path.join(tmp, "log"), "--overwrite"],
                                 a.timeout))
                    os.remove(path)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
