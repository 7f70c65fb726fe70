"""Link delay without netem: a userspace forwarder on a TUN device in the router namespace.

The kernels we run on have ``tbf`` and ``htb`` but not ``netem``, and no qdisc that holds a packet for a
time (``fq``'s earliest-departure time is missing too). So the router routes the packets of every
delayed host pair (policy rules on source and destination) into a TUN device; this process reads each
packet, holds it for the pair's one-way delay, and writes it back into the TUN device, from where the
kernel routes it on to its destination (a rule sends what comes *from* the TUN device to the main
table). Packets of one pair keep their order (one delay per pair, released in arrival order).

What it costs: one read and one write per packet (jumbo frames keep packets few), and the release is
as punctual as the scheduler wakes this process (``select`` timeouts): well under a millisecond on an
idle machine, more under load -- the testbed measures the round trips it actually gets.

    python -m hopdec.testbed.delay TUN_NAME SUBNET_OCTETS 'I:J:SECONDS,...'

prints ``ready`` once the device exists (the caller then configures it) and runs until killed or until
its parent dies. Hosts are told apart by the third octet of their IPv4 addresses (10.213.I.x).
"""

import ctypes
import fcntl
import heapq
import os
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454ca
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
PR_SET_PDEATHSIG = 1


def parse_delays(text):
    """``'I:J:SECONDS,...'`` -> ``{(I, J): seconds}`` (host indices)."""
    out = {}
    for part in filter(None, text.split(",")):
        i, j, s = part.split(":")
        out[(int(i), int(j))] = float(s)
    return out


def open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def forward(fd, delays, prefix, clock=time.monotonic):
    """Hold every packet read from ``fd`` for its pair's delay, then write it back. ``prefix``: the first
    two octets of the hosts' addresses (bytes); other packets go back at once."""
    held = []                                   # (release time, sequence, packet)
    seq = 0
    while True:
        now = clock()
        while held and held[0][0] <= now:
            pkt = heapq.heappop(held)[2]
            try:
                os.write(fd, pkt)
            except OSError:
                pass                            # (a packet the kernel refuses is a lost packet)
        timeout = None if not held else max(0.0, held[0][0] - now)
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            continue
        t = clock()
        for _ in range(256):                    # drain what is there, stamped with this instant
            try:
                pkt = os.read(fd, 65536)
            except BlockingIOError:
                break
            d = 0.0
            if len(pkt) >= 20 and pkt[0] >> 4 == 4 and pkt[12:14] == prefix and pkt[16:18] == prefix:
                d = delays.get((pkt[14], pkt[18]), 0.0)
            seq += 1
            heapq.heappush(held, (t + d, seq, pkt))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    name, octets, spec = argv
    try:                                        # die with the testbed that started us
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        return 1
    a, b = (int(x) for x in octets.split("."))
    fd = open_tun(name)
    print("ready", flush=True)
    try:
        forward(fd, parse_delays(spec), bytes([a, b]))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
