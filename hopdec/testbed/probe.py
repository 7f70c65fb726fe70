"""Measure what an emulated link gives: TCP round trips and bulk throughput, with plain sockets.

Run inside the namespaces (there is no ``ping`` or ``iperf`` on the machines we test on):

    python -m hopdec.testbed.probe serve ADDR PORT          # echo 1-byte pings; count bulk bytes
    python -m hopdec.testbed.probe rtt ADDR PORT COUNT      # prints min/median/max round trip (ms)
    python -m hopdec.testbed.probe bulk ADDR PORT SECONDS   # prints the receiver's Mbit/s

A round trip is a 1-byte TCP ping-pong (``TCP_NODELAY``): one-way delays both ways plus the stack's and
the delay forwarder's own time. Bulk throughput is measured at the receiver from its first byte, over
the last 3/4 of the transfer (TCP's slow start left out).
"""

import json
import socket
import statistics
import sys
import time


def serve(addr, port, conns=2, timeout=30.0):
    """Serve ``conns`` connections one after the other: first byte ``p`` = echo pings, ``b`` = bulk
    (reply with the JSON throughput at the end)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(1)
    s.settimeout(timeout)
    print("ready", flush=True)
    for _ in range(conns):
        c, _ = s.accept()
        c.settimeout(timeout)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        kind = c.recv(1)
        if kind == b"p":
            while True:
                b = c.recv(1)
                if not b:
                    break
                c.sendall(b)
        elif kind == b"b":
            marks = []
            n = 0
            while True:
                b = c.recv(1 << 20)
                if not b:                       # the sender shut its side: done
                    break
                n += len(b)
                marks.append((time.perf_counter(), n))
            t0 = marks[0][0]
            span = marks[-1][0] - t0
            cut = next((m for m in marks if m[0] - t0 >= span / 4), marks[0])
            rate = (marks[-1][1] - cut[1]) * 8 / max(marks[-1][0] - cut[0], 1e-9) / 1e6
            c.sendall(json.dumps({"mbit": rate, "bytes": n}).encode())
        c.close()


def rtt(addr, port, count=20):
    c = socket.create_connection((addr, port), timeout=30)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sendall(b"p")
    out = []
    for _ in range(count):
        t = time.perf_counter()
        c.sendall(b"x")
        c.recv(1)
        out.append((time.perf_counter() - t) * 1e3)
    c.close()
    return {"rtt_ms_min": min(out), "rtt_ms_median": statistics.median(out), "rtt_ms_max": max(out)}


def bulk(addr, port, seconds=2.0):
    c = socket.create_connection((addr, port), timeout=30)
    c.sendall(b"b")
    block = b"x" * (1 << 16)
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        c.sendall(block)
    c.shutdown(socket.SHUT_WR)
    reply = b""
    while True:
        b = c.recv(4096)
        if not b:
            break
        reply += b
    return json.loads(reply)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cmd, addr, port = argv[0], argv[1], int(argv[2])
    if cmd == "serve":
        serve(addr, port, conns=int(argv[3]) if len(argv) > 3 else 2)
    elif cmd == "rtt":
        print(json.dumps(rtt(addr, port, int(argv[3]))))
    elif cmd == "bulk":
        print(json.dumps(bulk(addr, port, float(argv[3]))))
    else:
        sys.exit(f"probe: unknown command {cmd}")


if __name__ == "__main__":
    main()
