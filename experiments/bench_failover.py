"""How fast the survivors of a failure notice it and heal (``--fault-tolerance``).

Runs ``launch/local.sh -n 8 --fault-tolerance`` (decentralized, ring_based_8, tokens, compute padded to
``--compute-time``), and when worker 3 has logged ``--at`` iterations it is killed (SIGKILL: a crashed
node) or stopped (SIGSTOP: a hung node, alive but silent). From the survivors' ``heal`` log events:

- detection: the first survivor's recovery start minus the moment of the signal (this script's clock;
  every rank is on this machine, so one clock);
- stall: the longest recovery (revoke, shrink, exchange of iterations, heal, reconfigure) of a survivor.

Transports: ``tcp`` (what the launch scripts use: a dead peer's sockets close) and ``sm`` (shared
memory plus the heartbeat detector, ``HOPDEC_FT_BTL=self,sm``). Prints a table and writes JSON.

    python3 experiments/bench_failover.py --repeats 3 --json failover.json
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VICTIM = 3


def read(log, rank):
    path = os.path.join(log, f"rank{rank}.jsonl")
    if not os.path.exists(path):
        return None, [], []
    with open(path) as f:
        lines = [json.loads(ln) for ln in f.read().splitlines() if ln.endswith("}")]
    if not lines:
        return None, [], []
    return lines[0], [r for r in lines[1:] if "iter" in r], [r for r in lines[1:] if r.get("event") == "heal"]


def one_run(transport, how, at, compute_time, timeout_s, iterations):
    log = tempfile.mkdtemp(prefix="hopdec-failover-")
    env = dict(os.environ, HOPDEC_CMD=f"{sys.executable} -m hopdec.cli train", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HOPDEC_FT_TIMEOUT=str(timeout_s))
    if transport == "sm":
        env["HOPDEC_FT_BTL"] = "self,sm"
    cmd = [os.path.join(ROOT, "launch", "local.sh"), "-n", "8", "--fault-tolerance", "--no-progress",
           "--threads", "1", "--topology", os.path.join(ROOT, "topologies", "ring_based_8.json"),
           "--protocol", "tokens", "--iterations", str(iterations), "--compute-time", str(compute_time),
           "--peer-timeout", "60", "--log-dir", log]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 300
    victim_pid = None
    try:
        while len(read(log, VICTIM)[1]) < at:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the run {'ended' if proc.poll() is not None else 'ran 300 s'} before "
                                   f"worker {VICTIM} logged {at} iterations (--at; --iterations is {iterations})")
            time.sleep(0.01)
        victim_pid = read(log, VICTIM)[0]["run"]["pid"]
        t_fail = time.time()
        os.kill(victim_pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        survivors = [r for r in range(8) if r != VICTIM]
        while how == "stop" and not all(read(log, r)[2] for r in survivors):
            if proc.poll() is not None or time.time() > deadline:
                break
            time.sleep(0.05)
        if how == "stop":
            os.kill(victim_pid, signal.SIGKILL)    # declared dead already; let mpirun end
        out, err = proc.communicate(timeout=max(1.0, deadline - time.time()))
    except BaseException as exc:
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # (the session may have ended already)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        if not isinstance(exc, Exception):          # Ctrl-C: the job is gone, stop here
            raise
        last = (err.strip() or out.strip()).splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"{exc} (exit {proc.returncode}; its last line: {last[0][:300]})") from None
    heals = [read(log, r)[2] for r in range(8) if r != VICTIM]
    if proc.returncode != 0 or not all(heals):
        last = (err.strip() or out.strip()).splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the run ended {proc.returncode} with {sum(map(bool, heals))} of 7 survivors healed "
                           f"(logs in {log}; its last line: {last[0][:300]})")
    starts = [h[0]["time"] for h in heals]
    return dict(detect_s=min(starts) - t_fail, last_detect_s=max(starts) - t_fail,
                stall_s=max(h[0]["stall_s"] for h in heals))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--at", type=int, default=30, help="iterations of the victim before the failure")
    p.add_argument("--iterations", type=int, default=150)
    p.add_argument("--compute-time", type=float, default=0.03)
    p.add_argument("--detector-timeout", type=float, default=10.0,
                   help="heartbeat timeout, s (HOPDEC_FT_TIMEOUT; the launch scripts' default is 10)")
    p.add_argument("--cases", default="tcp:kill,sm:kill,tcp:stop",
                   help="transport:how pairs (transport tcp|sm, how kill|stop)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    rows = []
    cases = [tuple(c.split(":")) for c in a.cases.split(",")]
    bad = [":".join(c) for c in cases if len(c) != 2 or c[0] not in ("tcp", "sm") or c[1] not in ("kill", "stop")]
    if bad:
        p.error(f"--cases {a.cases}: {', '.join(bad)} is not transport:how (tcp|sm : kill|stop)")
    if not 1 <= a.at < a.iterations:
        p.error(f"--at {a.at}: must be 1..{a.iterations - 1} (below --iterations {a.iterations})")
    for transport, how in cases:
        try:
            runs = [one_run(transport, how, a.at, a.compute_time, a.detector_timeout, a.iterations)
                    for _ in range(a.repeats)]
        except RuntimeError as err:
            print(f"bench_failover: {transport}:{how}: {err}", file=sys.stderr)
            return 1
        row = dict(transport=transport, failure="SIGKILL (crash)" if how == "kill" else "SIGSTOP (hang)",
                   runs=runs, **{k: statistics.median(r[k] for r in runs)
                                 for k in ("detect_s", "last_detect_s", "stall_s")})
        rows.append(row)
        print(f"{transport:4} {row['failure']:16} detection {row['detect_s']:.3f} s (last survivor "
              f"{row['last_detect_s']:.3f} s), recovery stall {row['stall_s']:.3f} s  "
              f"[median of {a.repeats}]", flush=True)
    conditions = dict(workers=8, topology="ring_based_8", compute_time=a.compute_time, at=a.at,
                      detector_period_s=1, detector_timeout_s=a.detector_timeout, host=os.uname().nodename,
                      cores=os.cpu_count())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(conditions=conditions, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
