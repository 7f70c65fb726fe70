"""Training throughput of 1..8 ranks sharing one GPU: ``hopdec train --device cuda`` for real.

    python3 experiments/gpu_throughput.py [--ranks 1,2,4,8] [--workloads cnn,vgg11,transformer] [--json OUT]

Each workload runs ``mpirun -n N hopdec train --device cuda`` (every rank on ``cuda:0``, the default graph,
no emulation) once per N, one after the other; the table gives the ranks' mean iterations/s as the summary
measured it, their sum (what the GPU delivers to the run), that sum against one process alone on the GPU,
and the summary's PCIe line (bytes copied between host and device per iteration and rank). Workloads:
``cnn`` on the shipped digits; ``vgg11`` (the biggest shipped model, 9.2 M parameters) on random
CIFAR-shaped images made here (:func:`cifar_shaped`: no download on a machine without network, so its
accuracy means nothing -- throughput only); ``transformer`` on the shipped KJV corpus. Rank 0 of each job
writes its logs to a temporary directory, removed afterwards.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WORKLOADS = {
    "cnn": (["--model", "cnn", "--dataset", "digits"], 300),
    "vgg11": (["--model", "vgg11", "--dataset", f"{os.path.join(HERE, 'gpu_throughput.py')}:cifar_shaped"], 60),
    "transformer": (["--model", "transformer", "--dataset", "kjv"], 100),
}
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s")


def cifar_shaped(seed):
    """``--dataset``: 10,000 random 3x32x32 training images and 1,000 test images in 10 classes (the shape of
    CIFAR-10, for throughput where it cannot be downloaded)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(10_000, 3, 32, 32, generator=g), torch.randint(0, 10, (10_000,), generator=g),
            torch.randn(1_000, 3, 32, 32, generator=g), torch.randint(0, 10, (1_000,), generator=g))


def versions():
    """The device, driver, torch and MPI versions (the table's conditions)."""
    import torch
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    mpi = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version()"
                          ".splitlines()[0])"], capture_output=True, text=True).stdout.strip()
    return dict(gpu=smi, torch=torch.__version__, cuda=torch.version.cuda, mpi=mpi, cpus=os.cpu_count())


def run(workload, n, timeout):
    args, iters = WORKLOADS[workload]
    with tempfile.TemporaryDirectory() as logs:
        cmd = (["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(n), sys.executable, "-m", "hopdec.cli",
                "train", "--device", "cuda", "--no-progress", "--threads", "1", "--iterations", str(iters),
                "--log-dir", logs] + args)
        t0 = time.time()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        wall = time.time() - t0
    if out.returncode != 0:
        return dict(workload=workload, ranks=n, error=(out.stderr.strip().splitlines() or ["?"])[-1][:300])
    rates = [float(m.group(3)) for m in map(ROW.match, out.stdout.splitlines()) if m]
    pcie = next((ln for ln in out.stdout.splitlines() if ln.startswith("PCIe: ")), None)
    return dict(workload=workload, ranks=n, iterations=iters, per_rank=sum(rates) / len(rates),
                total=sum(rates), wall_s=round(wall, 1), pcie=pcie)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="1,2,4,8")
    p.add_argument("--workloads", default="cnn,vgg11,transformer")
    p.add_argument("--timeout", type=float, default=240, help="seconds per job")
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args()
    env = versions()
    print(f"GPU {env['gpu']}; torch {env['torch']} (CUDA {env['cuda']}); {env['mpi']}; {env['cpus']} CPUs", flush=True)
    rows = []
    for w in a.workloads.split(","):
        for n in map(int, a.ranks.split(",")):
            r = run(w, n, a.timeout)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print("\n| workload | ranks on the GPU | iter/s per rank | iter/s, all ranks | vs 1 process | PCIe per iteration and rank |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['workload']} | {r['ranks']} | failed: {r['error']} | | | |")
            continue
        one = next((x for x in rows if x["workload"] == r["workload"] and x["ranks"] == 1 and "total" in x), None)
        vs = f"{r['total'] / one['total']:.2f}x" if one else "-"
        pc = (r["pcie"] or "").split(" copied ")[-1].split(" per iteration")[0]
        print(f"| {r['workload']} | {r['ranks']} | {r['per_rank']:.1f} | {r['total']:.1f} | {vs} | {pc} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(conditions=env, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
