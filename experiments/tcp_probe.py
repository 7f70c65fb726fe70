"""How messages move over Open MPI's TCP transport, on a testbed: what the simulator's network and send
models assume (hopdec/sim/network.py, hopdec/sim/sends.py), measured.

    python -m hopdec.testbed up -n 2 --nic 20          # in one terminal: two hosts, 20 Mbit/s NICs
    HOPDEC_CMD="python experiments/tcp_probe.py MODE BYTES SECONDS" HOPDEC_INTERFACE=10.213.0.0/16 \\
      HOPDEC_MPIRUN_ARGS="--mca plm_rsh_agent /tmp/hopdec-testbed/ID/rsh-agent --mca btl_tcp_eager_limit 4096" \\
      ip netns exec ID-r0 launch/hostfile.sh -f /tmp/hopdec-testbed/ID/hostfile -n 2

MODE (the simulator's ``--rendezvous push`` model, hopdec/sim/sends.py, says what each should show):

* ``sender-busy``: rank 0 Isends, tests once, then computes SECONDS with no MPI call, then Waits. The
  data should move only once the sender is back in MPI (it has to answer the receiver's acknowledgement).
* ``receiver-busy``: rank 1 posts its Irecv, then computes SECONDS; rank 0 Isends and Waits. The data
  should move only once the receiver is back in MPI (it acknowledges then).
* ``sender-busy-after-start``: rank 0 Isends and polls for 20 ms (the handshake and the first writes
  happen), then computes SECONDS, then Waits. Does the rest of the message move while the sender computes?
* ``fanin`` (any number of ranks): every other rank Isends BYTES to rank 0 at once, which computes SECONDS
  (no MPI call) after posting its receives, then polls; the simulator shares rank 0's NIC equally.
* ``fanout`` (any number of ranks, SECONDS unused; e.g. ``up -n 8 --nic 100 --host-nic r0=20``): rank 0
  Isends BYTES to every other rank at once, as a parameter server sends its weights. The simulator shares
  rank 0's NIC equally, so every message arrives when the last byte of all has left; prints the arrivals.

Each of 3 trials prints, in ms after the send began, when the receive completed and when the send's
Wait returned. Results on this machine: experiments/README.md ("Emulated links").
"""

import sys
import time

import numpy as np
from mpi4py import MPI


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def trials(nbytes, count):
    """``(rank, ranks, a message of nbytes, trial, its start time)`` for each trial, all ranks in step."""
    comm = MPI.COMM_WORLD
    buf = np.ones(nbytes, dtype=np.uint8)
    for trial in range(count):
        comm.Barrier()
        yield comm.Get_rank(), comm.Get_size(), buf, trial, MPI.Wtime()


def fanout(nbytes):
    comm = MPI.COMM_WORLD
    for rank, n, buf, trial, t0 in trials(nbytes, 5):
        if rank == 0:
            MPI.Request.Waitall([comm.Isend(buf, dest=d, tag=trial) for d in range(1, n)])
            t = 0.0
        else:
            got = np.empty(nbytes, dtype=np.uint8)
            req = comm.Irecv(got, source=0, tag=trial)
            while not req.Test():
                time.sleep(0.0001)
            t = MPI.Wtime() - t0            # (the hosts are namespaces of one machine: one clock)
        times = comm.gather(t, root=0)
        if rank == 0:
            print(f"fanout {nbytes} B to {n - 1}: arrivals at " + ", ".join(f"{x * 1e3:.1f}" for x in sorted(times[1:]))
                  + " ms", flush=True)


def fanin(nbytes, seconds):
    comm = MPI.COMM_WORLD
    for rank, n, buf, trial, t0 in trials(nbytes, 5):
        if rank == 0:
            got = [np.empty(nbytes, dtype=np.uint8) for _ in range(1, n)]
            reqs = [comm.Irecv(g, source=s, tag=trial) for s, g in zip(range(1, n), got)]
            busy(seconds)
            done = [None] * len(reqs)
            while None in done:
                for i, req in enumerate(reqs):
                    if done[i] is None and req.Test():
                        done[i] = MPI.Wtime() - t0
                time.sleep(0.0001)
            print(f"fanin {n - 1} x {nbytes} B, receiver busy {seconds} s: arrivals at "
                  + ", ".join(f"{x * 1e3:.1f}" for x in sorted(done)) + " ms", flush=True)
        else:
            comm.Isend(buf, dest=0, tag=trial).Wait()


def main(mode, nbytes, seconds):
    if mode == "fanout":
        return fanout(nbytes)
    if mode == "fanin":
        return fanin(nbytes, seconds)
    comm = MPI.COMM_WORLD
    for rank, _, buf, trial, t0 in trials(nbytes, 3):
        if rank == 0:
            req = comm.Isend(buf, dest=1, tag=trial)
            if mode == "sender-busy":
                req.Test()
                busy(seconds)
            elif mode == "sender-busy-after-start":
                end = time.perf_counter() + 0.02
                while time.perf_counter() < end and not req.Test():
                    pass
                busy(seconds)
            req.Wait()
            comm.send(MPI.Wtime() - t0, dest=1, tag=1000)
        else:
            got = np.empty(nbytes, dtype=np.uint8)
            req = comm.Irecv(got, source=0, tag=trial)
            if mode == "receiver-busy":
                busy(seconds)
            while not req.Test():
                time.sleep(0.0002)
            done = MPI.Wtime() - t0
            sent = comm.recv(source=0, tag=1000)
            print(f"{mode} {nbytes} B, busy {seconds} s: receive done at {done * 1e3:.1f} ms, the send's Wait "
                  f"returned at {sent * 1e3:.1f} ms", flush=True)


if __name__ == "__main__":
    modes = ("sender-busy", "receiver-busy", "sender-busy-after-start", "fanin", "fanout")
    if len(sys.argv) != 4 or sys.argv[1] not in modes:
        sys.exit(f"usage: tcp_probe.py {'|'.join(modes)} BYTES SECONDS")
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
