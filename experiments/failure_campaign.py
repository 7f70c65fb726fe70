"""Random failures, seeded: does every job end, with one line, and say what happened?

Each job is a real ``launch/local.sh -n N hopdec train`` run with a failure injected (the hidden options of
:mod:`hopdec.runtime.faults`) at a random place: decentralized (tokens, a random graph, sometimes backup
workers and skipping) or a parameter server (a random sync model); with or without ``--fault-tolerance``;
one random rank (the server too) exits (a crash), raises (a bug) or hangs (alive, silent) in setup,
training, the summary or at shutdown. A job is flagged when it

- outlives ``--bound`` seconds (a job that never ends);
- prints more than one error line;
- fails with no line at all (neither hopdec's nor Open MPI's box naming the rank that exited);
- exits 0 without a summary;
- is a fault-tolerant PS run whose worker died after training and whose summary does not name it.

Prints one line per job and writes each flagged job's output to ``--out``. Exit status 1 if any was
flagged. The bounds: ``--peer-timeout 45`` (above the failure detector's 30 s), so a hung rank is found
within about a minute.

    python3 experiments/failure_campaign.py --seed 1 --jobs 30
"""

import argparse
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYNCS = ["bsp", "asp", "ssp", "dssp", "elastic", "backup", "esync"]
GRAPHS = ["ring", "exponential", "complete", "ring-based"]


def draw(rng, iterations):
    """One job: (ranks, options, what was injected)."""
    n = rng.choice([3, 4, 5])
    ft, ps = rng.random() < 0.7, rng.random() < 0.5
    phase = rng.choice(["setup", "train", "train", "evaluate", "shutdown"])
    how = rng.choice(["exit", "exit", "raise", "hang"])
    victim = rng.randrange(n)
    args = ["--no-progress", "--threads", "1", "--iterations", str(iterations), "--compute-time", "0.01",
            "--peer-timeout", "45"] + (["--fault-tolerance"] if ft else [])
    if ps:
        args += ["--sync", rng.choice(SYNCS)]
    else:
        args += ["--topology", rng.choice(GRAPHS), "--protocol", "tokens"]
        if rng.random() < 0.5:
            args += ["--backup-workers", "1", "--skip", "max-jump=2"]
    args += ["--die-rank", str(victim), "--die-at", str(rng.randrange(iterations)), "--die-phase", phase,
             "--die-how", how]
    return n, args, dict(ft=ft, ps=ps, phase=phase, how=how, victim=victim)


def judge(rc, out, err, f):
    """Why the job is flagged (empty: it is not)."""
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    boxed = "Exit code:" in err or "exited on signal" in err         # Open MPI's box names the rank
    late_ps = f["ft"] and f["ps"] and f["victim"] != 0 and f["how"] == "exit" and f["phase"] in ("evaluate",
                                                                                                   "shutdown")
    if rc is None:
        return "never ended"
    if len(errors) > 1:
        return "more than one error line"
    if rc != 0 and not errors and not boxed and "hopdec:" not in err:
        return "failed without a line"
    if rc == 0 and "== " not in out:
        return "exit 0 without a summary"
    if late_ps and rc == 0 and f"worker {f['victim']} died" not in out:
        return "a worker's death after training not named"
    return ""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=30)
    p.add_argument("--iterations", type=int, default=25)
    p.add_argument("--bound", type=float, default=200.0, help="seconds a job may take before it is flagged")
    p.add_argument("--out", default="failure_campaign", help="folder for the flagged jobs' output")
    a = p.parse_args(argv)
    rng = random.Random(a.seed)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HOPDEC_DEBUG="",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))  # (this venv's mpirun)
    flagged = 0
    for i in range(a.jobs):
        n, args, f = draw(rng, a.iterations)
        t0 = time.time()
        try:
            done = subprocess.run([os.path.join(ROOT, "launch", "local.sh"), "-n", str(n)] + args, cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=a.bound)
            rc, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as e:          # (the launcher's watchdog ends the job it leaves)
            rc, out, err = None, _text(e.stdout), _text(e.stderr)
        if err.startswith("local.sh: error:"):          # the launcher refused: nothing was tested
            print(err.strip(), file=sys.stderr)
            return 2
        why = judge(rc, out, err, f)
        line = next((ln for ln in err.splitlines() if "error:" in ln), "")
        print(f"{i:3d} n={n} {'FT' if f['ft'] else '  '} {'ps ' if f['ps'] else 'hop'} {f['how']:5s} in "
              f"{f['phase']:8s} rank {f['victim']}: rc={rc} {time.time() - t0:4.0f} s "
              f"{'summary' if '== ' in out else '       '} {line[:110]}" + (f"  <<< {why}" if why else ""),
              flush=True)
        if why:
            flagged += 1
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, f"seed{a.seed}_job{i}.txt"), "w") as fh:
                fh.write(" ".join(args) + f"\n{why}\n--- stdout\n{out}\n--- stderr\n{err}")
    print(f"{flagged} of {a.jobs} jobs flagged (seed {a.seed})")
    return 1 if flagged else 0


def _text(b):
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


if __name__ == "__main__":
    sys.exit(main())
