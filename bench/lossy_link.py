"""A slow, lossy link between two network namespaces, in user space (issue 17's benchmark).

This kernel has no `sch_netem` (`tc qdisc ... netem` fails with "Specified qdisc kind is
unknown"), so the link is a relay instead: two TUN devices, one moved into each namespace as a
point-to-point interface, and this process copying IP packets between them after a one-way
delay, dropping each packet with a probability. TCP and UDP see the same link: packets are
delayed and lost below both, as netem would.

Usage: lossy_link.py NS_A ADDR_A NS_B ADDR_B DELAY_MS CONTROL_FILE TIME_LIMIT_S
CONTROL_FILE holds the loss probability (0 to 1), re-read every 0.2 s, so one link serves
several runs. The relay stops after TIME_LIMIT_S or on SIGTERM; the namespaces are the
caller's to delete (deleting one deletes its TUN device).
"""
import asyncio
import collections
import fcntl
import os
import random
import signal
import struct
import subprocess
import sys

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def sh(*args):
    subprocess.run(args, check=True)


def tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def place(name, ns, addr, peer):
    sh("ip", "link", "set", name, "netns", ns)
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", ns, "addr", "add", f"{addr}/32", "peer", f"{peer}/32", "dev", name)
    sh("ip", "-n", ns, "link", "set", name, "up")


async def relay(a, b, delay, control, time_limit):
    loop = asyncio.get_running_loop()
    state = {"loss": 0.0}
    counts = {"relayed": 0, "dropped": 0, "overflow": 0}

    def pump(src, dst):
        # The delay is constant, so packets leave in arrival order: one queue and one timer per
        # direction (a timer per packet would cost more than the relaying).
        pending = collections.deque()

        def drain():
            now = loop.time()
            while pending and pending[0][0] <= now:
                _, packet = pending.popleft()
                try:
                    os.write(dst, packet)
                    counts["relayed"] += 1
                except OSError:
                    counts["overflow"] += 1  # A full device: one more lost packet.
            if pending:
                loop.call_at(pending[0][0], drain)

        def readable():
            while True:
                try:
                    packet = os.read(src, 65536)
                except OSError:
                    return
                if random.random() < state["loss"]:
                    counts["dropped"] += 1
                    continue
                pending.append((loop.time() + delay, packet))
                if len(pending) == 1:
                    loop.call_at(pending[0][0], drain)

        loop.add_reader(src, readable)

    pump(a, b)
    pump(b, a)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.call_later(time_limit, stop.set)
    while not stop.is_set():
        try:
            state["loss"] = min(1.0, max(0.0, float(open(control).read().strip() or 0)))
        except (OSError, ValueError):
            pass
        try:
            await asyncio.wait_for(stop.wait(), 0.2)
        except asyncio.TimeoutError:
            pass
    print(f"lossy link: {counts}", file=sys.stderr)


def main():
    ns_a, addr_a, ns_b, addr_b, delay_ms, control, time_limit = sys.argv[1:8]
    a, b = tun("fhq-ta"), tun("fhq-tb")
    place("fhq-ta", ns_a, addr_a, addr_b)
    place("fhq-tb", ns_b, addr_b, addr_a)
    for ns, name in ((ns_a, "fhq-ta"), (ns_b, "fhq-tb")):
        # Room for a burst of handshakes: the default 500 packets overflow at 128 at a time.
        sh("ip", "-n", ns, "link", "set", name, "txqueuelen", "10000")
    print("ready", flush=True)
    asyncio.run(relay(a, b, float(delay_ms) / 1000, control, float(time_limit)))


if __name__ == "__main__":
    main()
