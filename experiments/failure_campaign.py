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
- is a fault-tolerant PS run whose worker died after training and whose summary does not name it;
- exits 0 although a rank raised or exited with a failure status (``sys.exit("...")``);
- fails although it is fault tolerant and a worker only crashed (exit) while training (or, in a loop,
  after building its optimizer): the survivors heal and finish.

``--kind loop`` runs a user's own loop instead (``campaign_loop.py``: ``HopOptimizer`` around a torch
optimizer, failures in plain Python -- ``os._exit``, an exception, ``sys.exit("...")``, a hang, SIGSTOP --
before or after building the optimizer, in a step, before ``finish()``, before ``consensus_model()``, at
the end); ``--kind mixed`` either at random. A loop's hang or stop after its last hopdec call is not
flagged when the job never ends: that is the user's code, which MPI_Finalize waits for as in any MPI
program. Loop jobs get ``HOPDEC_STARTUP_TIMEOUT=60`` (the constructor's wait for every rank; 600 s by
default).

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
LOOP = os.path.join(ROOT, "experiments", "campaign_loop.py")


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


def random_digraph(n, seed):
    """A random strongly connected directed graph on ``n`` ranks (edges with probability 0.4 or 0.6, drawn
    again until strongly connected), unweighted: the optimizer gives it Hop eq. (1) weights."""
    import networkx as nx
    rng = random.Random(seed)
    while True:
        g = nx.gnp_random_graph(n, rng.choice([0.4, 0.6]), seed=rng.randrange(10 ** 6), directed=True)
        if nx.is_strongly_connected(g):
            return g


def loop_graphs(n):
    """The named graphs a loop of ``n`` ranks can use (ring-based needs an even n; the torus here, 2 x 2)."""
    return ["ring", "exponential", "complete"] + (["ring-based"] if n % 2 == 0 else []) + (["torus"] if n == 4 else [])


def draw_loop(rng, iterations):
    """One job of a user's own loop (``campaign_loop.py``, ``HopOptimizer``): (ranks, its arguments, what
    was injected). Its failures are plain Python, as a user's code or machine would fail. A third of the
    jobs run on a random directed graph (backup workers only where every rank hears from 2 others, as the
    optimizer requires); without fault tolerance, some take local steps or compress their exchanges."""
    n = rng.choice([3, 4, 5])
    ft = rng.random() < 0.6
    phase = rng.choice(["setup", "built", "train", "train", "train", "finish", "consensus", "shutdown"])
    how = rng.choice(["exit", "exit", "raise", "sysexit", "hang", "stop"])
    victim = rng.randrange(n)
    if rng.random() < 0.35:
        seed = rng.randrange(10 ** 6)
        graph, g = f"random:{seed}", random_digraph(n, seed)
        can_back = min(d for _, d in g.in_degree()) >= 2
    else:
        graph = rng.choice(loop_graphs(n))
        can_back = True
    args = ["--steps", str(iterations), "--peer-timeout", "45", "--optimizer", rng.choice(["sgd", "adamw", "adam"]),
            "--topology", graph] + (["--fault-tolerance"] if ft else [])
    if can_back and rng.random() < 0.4:
        args += ["--backup-workers", "1", "--skip", "max-jump=2"]
    if rng.random() < 0.4:
        args += ["--uneven"]
    if not ft and rng.random() < 0.5:       # (neither is supported with fault tolerance)
        args += rng.choice([["--local-steps", str(rng.choice([2, 3]))],
                            ["--compress", rng.choice(["fp16", "int8", "topk:0.25"])],
                            ["--local-steps", "2", "--compress", "bf16"]])
    args += ["--victim", str(victim), "--phase", phase, "--at", str(rng.randrange(iterations)), "--how", how]
    return n, args, dict(ft=ft, ps=False, phase=phase, how=how, victim=victim, loop=True)


def judge(rc, out, err, f):
    """Why the job is flagged (empty: it is not)."""
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    boxed = "Exit code:" in err or "exited on signal" in err         # Open MPI's box names the rank
    late_ps = f["ft"] and f["ps"] and f["victim"] != 0 and f["how"] == "exit" and f["phase"] in ("evaluate",
                                                                                                   "shutdown")
    if rc is None:
        # (a user's code that hangs after its last hopdec call is the user's: MPI_Finalize waits for it,
        # as for any MPI program, and hopdec cannot tell it from a long evaluation or save on that rank)
        return "" if f.get("loop") and f["phase"] == "shutdown" and f["how"] in ("hang", "stop") else "never ended"
    if len(errors) > 1:
        return "more than one error line"
    if rc != 0 and not errors and not boxed and "hopdec:" not in err:
        return "failed without a line"
    if rc == 0 and "== " not in out:
        return "exit 0 without a summary"
    heals = f["ft"] and f["how"] == "exit" and f["phase"] in ("built", "train") and not (f["ps"] and f["victim"] == 0)
    if heals and rc != 0:
        return "a death fault tolerance heals ended the job"
    if rc == 0 and f["how"] in ("raise", "sysexit"):
        return "a failure ended 0"
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
    p.add_argument("--kind", choices=("train", "loop", "mixed"), default="train",
                   help="hopdec train jobs, a user's HopOptimizer loop (campaign_loop.py), or either at random")
    a = p.parse_args(argv)
    rng = random.Random(a.seed)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HOPDEC_DEBUG="",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))  # (this venv's mpirun)
    flagged = 0
    for i in range(a.jobs):
        loop = a.kind == "loop" or (a.kind == "mixed" and rng.random() < 0.5)
        n, args, f = (draw_loop if loop else draw)(rng, a.iterations)
        job_env = dict(env, HOPDEC_CMD=f"{sys.executable} {LOOP}", HOPDEC_STARTUP_TIMEOUT="60") if loop else env
        t0 = time.time()
        try:
            done = subprocess.run([os.path.join(ROOT, "launch", "local.sh"), "-n", str(n)] + args, cwd=ROOT,
                                  env=job_env, capture_output=True, text=True, timeout=a.bound)
            rc, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as e:          # (the launcher's watchdog ends the job it leaves)
            rc, out, err = None, _text(e.stdout), _text(e.stderr)
        if err.startswith("local.sh: error:"):          # the launcher refused: nothing was tested
            print(err.strip(), file=sys.stderr)
            return 2
        why = judge(rc, out, err, f)
        line = next((ln for ln in err.splitlines() if "error:" in ln), "")
        print(f"{i:3d} n={n} {'FT' if f['ft'] else '  '} {'loop' if loop else 'ps  ' if f['ps'] else 'hop '} "
              f"{f['how']:7s} in "
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
