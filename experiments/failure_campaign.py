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

``--kind resume`` runs pairs: a ``hopdec train`` job checkpointing (``--checkpoint-dir D --checkpoint-every
K``) that fails as above or is stopped (SIGINT or SIGTERM to the launcher, as Ctrl-C or a scheduler), its
checkpoints then sometimes damaged (a file truncated, bytes overwritten, another rank's file in its place, a
manifest of garbage, a rank's folder or latest file removed), then ``--resume D`` with more iterations. The
second job is judged as above, and also flagged when it failed although every rank's checkpoints were left
intact and shared a complete one, or succeeded although the checkpoint it had to start from was damaged;
when its line names an earlier checkpoint for ``--resume-at``, a third job resumes from that one and must
end well.

``--kind loop-resume`` runs pairs of a user's loop with its own periodic checkpoints (``campaign_loop.py
--checkpoint D``): the first fails in a step or is stopped, the second must resume from the latest
checkpoint every rank saved (it prints ``resumed at K``) and end well.

``--kind loop`` runs a user's own loop instead (``campaign_loop.py``: ``HopOptimizer`` around a torch
optimizer, failures in plain Python -- ``os._exit``, an exception, ``sys.exit("...")``, a hang, SIGSTOP --
before or after building the optimizer, in a step, before ``finish()``, before ``consensus_model()``, at
the end); ``--kind mixed`` either at random. A loop's hang or stop after its last hopdec call is not
flagged when the job never ends: that is the user's code, which MPI_Finalize waits for as in any MPI
program. Loop jobs get ``HOPDEC_STARTUP_TIMEOUT=60`` (the constructor's wait for every rank; 600 s by
default).

Prints one line per job (and each job's line whole to ``--out/seed{S}_lines.txt``) and writes each flagged
job's output to ``--out``. Exit status 1 if any was
flagged. The bounds: ``--peer-timeout 45`` (above the failure detector's 30 s), so a hung rank is found
within about a minute.

    python3 experiments/failure_campaign.py --seed 1 --jobs 30
"""

import argparse
import os
import random
import re
import shutil
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
        can_back = True
        if rng.random() < 0.3:          # a random directed graph, in an edge-list file (see main)
            seed = rng.randrange(10 ** 6)
            graph = f"random:{seed}"
            can_back = min(d for _, d in random_digraph(n, seed).in_degree()) >= 2
        else:
            graph = rng.choice([g for g in GRAPHS if g != "ring-based" or n % 2 == 0])
        args += ["--topology", graph, "--protocol", "tokens"]
        if can_back and rng.random() < 0.5:
            args += ["--backup-workers", "1", "--skip", "max-jump=2"]
    args += ["--die-rank", str(victim), "--die-at", str(rng.randrange(iterations)), "--die-phase", phase,
             "--die-how", how]
    return n, args, dict(ft=ft, ps=ps, phase=phase, how=how, victim=victim)


DAMAGE = ["truncate", "overwrite", "other-rank", "garbage-manifest", "remove-rank", "remove-latest"]


def draw_resume(rng, iterations):
    """One pair of jobs: (ranks, the first job's options, what was injected and damaged). The second job is
    the first's options without the failure, ``--resume D``, and 10 more iterations."""
    n, args, f = draw(rng, iterations)
    args = args[:args.index("--die-rank")]
    stop = rng.random() < 0.3
    if stop:
        f.update(how=rng.choice(["SIGINT", "SIGTERM"]), phase="train", after=rng.uniform(8, 25))
    elif f["phase"] == "train" or rng.random() < 0.6:
        f["phase"] = "train"
        args += ["--die-rank", str(f["victim"]), "--die-at", str(rng.randrange(2, iterations)), "--die-phase",
                 "train", "--die-how", f["how"]]
    else:
        f.update(how="none", phase="none")
    f.update(every=rng.choice([3, 4, 6]), damage=rng.choice(DAMAGE) if rng.random() < 0.4 else "none",
             damaged_rank=rng.randrange(n))
    return n, args + ["--checkpoint-every", str(f["every"])], f


def draw_loop_resume(rng, iterations):
    """One pair of a user's loop (``campaign_loop.py --checkpoint D``, its own periodic checkpoints): the
    first fails in a step as :func:`draw_loop` draws it, or is stopped (SIGINT or SIGTERM to the launcher:
    every rank saves where they stop); the second runs without the failure and must resume from the latest
    checkpoint every rank saved."""
    n, args, f = draw_loop(rng, iterations)
    args = args[:args.index("--victim")]
    if rng.random() < 0.3:
        f.update(how=rng.choice(["SIGINT", "SIGTERM"]), phase="train", after=rng.uniform(8, 20))
    else:
        f["phase"] = "train"
        args += ["--victim", str(f["victim"]), "--phase", "train", "--at", str(rng.randrange(4, iterations)),
                 "--how", f["how"]]
    f["every"] = rng.choice([2, 3, 5])
    return n, args + ["--every", str(f["every"])], f


def loop_keys(directory, n):
    """Each rank's saved iterations in a loop's checkpoint folder (``it{K}.pt``)."""
    keys = []
    for r in range(n):
        folder = os.path.join(directory, f"rank{r}")
        names = os.listdir(folder) if os.path.isdir(folder) else []
        keys.append({int(x[2:-3]) for x in names if x.startswith("it") and x.endswith(".pt")})
    return keys


def judge_loop_resume(rc, out, err, f, keys):
    """Why a loop's second job is flagged: as :func:`judge` (it must end 0 with its consensus), and it did
    not resume from the latest checkpoint every rank saved (or resumed when there was none)."""
    why = judge(rc, out, err, dict(f, how="none", phase="none"))
    if why or rc != 0:
        return why or "the resumed loop failed"
    common = set.intersection(*keys) if keys else set()
    said = re.search(r"^resumed at (\d+)$", out, re.M)
    if (int(said.group(1)) if said else None) != (max(common) if common else None):
        return f"resumed at {said.group(1) if said else None}, not at the latest common {max(common, default=None)}"
    return ""


def complete_keys(directory, n):
    """Each rank's complete checkpoint keys as its manifest lists them (None: no manifest or not JSON)."""
    import json
    keys = []
    for r in range(n):
        try:
            with open(os.path.join(directory, f"rank{r}", "manifest.json")) as fh:
                keys.append({int(k) for k in json.load(fh)["complete"]})
        except (OSError, ValueError, KeyError, TypeError):
            keys.append(None)
    return keys


def damage(directory, n, how, rank, rng):
    """Damage rank ``rank``'s checkpoints in ``directory`` as ``how`` says; returns the key it damaged
    (None: none, or every key of that rank)."""
    keys = complete_keys(directory, n)
    mine = sorted(keys[rank] or [])
    folder = os.path.join(directory, f"rank{rank}")
    if how == "remove-rank":
        shutil.rmtree(folder, ignore_errors=True)
        return None
    if how == "garbage-manifest":
        with open(os.path.join(folder, "manifest.json"), "wb") as fh:
            fh.write(bytes(rng.randrange(256) for _ in range(rng.choice([0, 7, 300]))))
        return None
    if not mine:
        return None
    key = mine[-1]
    path = os.path.join(folder, f"ckpt-{key:08d}.npz")
    if how == "remove-latest":
        os.unlink(path)
    elif how == "truncate":
        os.truncate(path, rng.randrange(os.path.getsize(path)))
    elif how == "overwrite":
        with open(path, "r+b") as fh:
            fh.seek(rng.randrange(os.path.getsize(path) - 16))
            fh.write(bytes(rng.randrange(256) for _ in range(16)))
    elif how == "other-rank":
        other = (rank + 1) % n
        theirs = os.path.join(directory, f"rank{other}", f"ckpt-{key:08d}.npz")
        if not os.path.exists(theirs):
            return None
        shutil.copyfile(theirs, path)
    return key


def judge_resume(rc, out, err, f, keys, damaged_key):
    """Why a ``--resume`` job is flagged, beyond :func:`judge`: it failed although it had an intact
    checkpoint every rank shared to start from, or went on although the one it had to start from was
    damaged. ``keys``: each rank's complete keys before the damage; ``damaged_key``: the file damaged."""
    why = judge(rc, out, err, dict(f, how="none", phase="none", loop=False))
    if why:
        return why
    common = set.intersection(*keys) if all(k is not None for k in keys) else set()
    start = max(common) if common else None
    whole_rank = f["damage"] in ("remove-rank", "garbage-manifest")
    hit = damaged_key is not None and damaged_key == start
    if rc != 0 and common and not whole_rank and not hit:
        return "an intact checkpoint was not resumed"
    if rc == 0 and (whole_rank or (hit and f["damage"] != "overwrite")):   # (16 bytes may miss the data)
        return "resumed from a damaged checkpoint"
    return ""


def edge_list_file(n, spec, folder):
    """``random:SEED`` written as a user writes a topology by hand: an edge list, ``u v`` per line, no
    weights (hopdec gives them Hop eq. (1)'s); returns its path."""
    path = os.path.join(folder, f"graph-{spec.split(':')[1]}.txt")
    with open(path, "w") as fh:
        fh.write("# a random directed graph (failure campaign)\n")
        fh.writelines(f"{u} {v}\n" for u, v in sorted(random_digraph(n, int(spec.split(":")[1])).edges))
    return path


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
    flat = " ".join(err.split())                                    # (Open MPI wraps its box's lines)
    boxed = "Exit code:" in flat or "exited on signal" in flat      # Open MPI's box names the rank
    late_ps = f["ft"] and f["ps"] and f["victim"] != 0 and f["how"] == "exit" and f["phase"] in ("evaluate",
                                                                                                   "shutdown")
    if rc is None:
        # (a user's code that hangs after its last hopdec call is the user's: MPI_Finalize waits for it,
        # as for any MPI program, and hopdec cannot tell it from a long evaluation or save on that rank)
        return "" if f.get("loop") and f["phase"] == "shutdown" and f["how"] in ("hang", "stop") else "never ended"
    if len(errors) > 1:
        return "more than one error line"
    said = any(re.match(r"hopdec( [a-z]+)?: (error: |stopped)", ln) or ln.startswith("hopdec: ")
               for ln in err.splitlines())
    if rc != 0 and not errors and not boxed and not said:
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


def run_job(n, args, env, bound, stop=None):
    """One ``launch/local.sh -n n ARGS`` job: (exit status or None when it outlived ``bound`` seconds,
    stdout, stderr). ``stop``: (signal, seconds): then SIGINT goes to the job's process group (Ctrl-C in a
    terminal), SIGTERM to the launcher alone (a scheduler)."""
    import signal
    p = subprocess.Popen([os.path.join(ROOT, "launch", "local.sh"), "-n", str(n)] + args, cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.time()
    try:
        if stop is not None:
            try:
                out, err = p.communicate(timeout=stop[1])
                return p.returncode, out, err
            except subprocess.TimeoutExpired:
                sig = getattr(signal, stop[0])
                os.killpg(p.pid, sig) if sig == signal.SIGINT else p.send_signal(sig)
        out, err = p.communicate(timeout=max(1.0, bound - (time.time() - t0)))
        return p.returncode, out, err
    except subprocess.TimeoutExpired:                   # (the launcher's watchdog ends the job it leaves)
        p.kill()
        out, err = p.communicate()
        return None, _text(out), _text(err)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=30)
    p.add_argument("--iterations", type=int, default=25)
    p.add_argument("--bound", type=float, default=200.0, help="seconds a job may take before it is flagged")
    p.add_argument("--out", default="failure_campaign", help="folder for the flagged jobs' output")
    p.add_argument("--kind", choices=("train", "loop", "mixed", "resume", "loop-resume"), default="train",
                   help="hopdec train jobs, a user's HopOptimizer loop (campaign_loop.py), either at random, "
                        "a checkpointing job then its --resume, or a loop with its own checkpoints then again")
    a = p.parse_args(argv)
    rng = random.Random(a.seed)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HOPDEC_DEBUG="",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))  # (this venv's mpirun)
    flagged = 0
    for i in range(a.jobs):
        loop = a.kind in ("loop", "loop-resume") or (a.kind == "mixed" and rng.random() < 0.5)
        resume = a.kind in ("resume", "loop-resume")
        n, args, f = (draw_loop_resume if loop and resume else draw_loop if loop else draw_resume if resume
                      else draw)(rng, a.iterations)
        job_env = dict(env, HOPDEC_CMD=f"{sys.executable} {LOOP}", HOPDEC_STARTUP_TIMEOUT="60") if loop else env
        graph, graphs = args[args.index("--topology") + 1] if "--topology" in args else "", None
        if not loop and graph.startswith("random:"):        # hopdec train reads a file
            import tempfile
            graphs = tempfile.mkdtemp(prefix="campaign-graph-")
            args[args.index("--topology") + 1] = edge_list_file(n, graph, graphs)
        if resume:
            import tempfile
            where = tempfile.mkdtemp(prefix="campaign-ckpt-")
            args += ["--checkpoint" if loop else "--checkpoint-dir", where]
        t0 = time.time()
        rc, out, err = run_job(n, args, job_env, a.bound, (f["how"], f["after"]) if "after" in f else None)
        if err.startswith("local.sh: error:"):          # the launcher refused: nothing was tested
            print(err.strip(), file=sys.stderr)
            return 2
        why = judge(rc, out, err, f)
        if resume and loop and not why:                 # then the same loop again, without the failure
            keys = loop_keys(where, n)
            again = args[:args.index("--victim")] + args[args.index("--every"):] if "--victim" in args else args
            rc, out, err = run_job(n, again, job_env, a.bound)
            why = judge_loop_resume(rc, out, err, f, keys)
        elif resume and not why:                        # then damage, and resume
            keys = complete_keys(where, n)
            hit = damage(where, n, f["damage"], f["damaged_rank"], rng) if f["damage"] != "none" else None
            at = args.index("--checkpoint-dir")
            again = [x for x in args[:at]] + ["--resume", where]
            again[again.index("--iterations") + 1] = str(a.iterations + 10)
            again = [x for j, x in enumerate(again) if not (x.startswith("--die-") or
                                                             (j and again[j - 1].startswith("--die-")))]
            rc, out, err = run_job(n, again, env, a.bound)
            why = judge_resume(rc, out, err, f, keys, hit)
            named = re.search(r"--resume-at (\d+) starts from the latest intact one", err)
            if not why and named:                       # the line's way on: that one must resume
                rc, out, err = run_job(n, again + ["--resume-at", named.group(1)], env, a.bound)
                why = "" if rc == 0 and "== " in out else f"--resume-at {named.group(1)}, as the line said: " + \
                    (judge(rc, out, err, dict(f, how="none", phase="none", loop=False)) or f"exit {rc}")
                f["damage"] += "+at"
            f["how"] = f"{f['how']}/{f['damage']}"[:16]
        if resume:
            shutil.rmtree(where, ignore_errors=True)
        if graphs:
            shutil.rmtree(graphs, ignore_errors=True)
        line = next((ln for ln in err.splitlines() if "error:" in ln), "")
        print(f"{i:3d} n={n} {'FT' if f['ft'] else '  '} {'loop' if loop else 'ps  ' if f['ps'] else 'hop '} "
              f"{f['how']:7s} in "
              f"{f['phase']:8s} rank {f['victim']}: rc={rc} {time.time() - t0:4.0f} s "
              f"{'summary' if '== ' in out else '       '} {line[:110]}" + (f"  <<< {why}" if why else ""),
              flush=True)
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"seed{a.seed}_lines.txt"), "a") as fh:    # (the lines above, whole)
            fh.write(f"{i}: {line}\n")
        if why:
            flagged += 1
            with open(os.path.join(a.out, f"seed{a.seed}_job{i}.txt"), "w") as fh:
                fh.write(" ".join(args) + f"\n{why}\n--- stdout\n{out}\n--- stderr\n{err}")
    print(f"{flagged} of {a.jobs} jobs flagged (seed {a.seed})")
    return 1 if flagged else 0


def _text(b):
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


if __name__ == "__main__":
    sys.exit(main())
