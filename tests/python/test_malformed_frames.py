"""AMQP frames whose header is malformed (seen in the AMQP library while writing the amqp_frames fuzz target, issue 18): a
frame size of 4 to 7 bytes, smaller than a frame's own 8-byte header, or a data offset below 2
words or past the frame's end. The AMQP library the hub uses read the missing header bytes
without checking and panicked; the hub now refuses such a frame as a framing error: the
connection is closed, nothing panics, and the listener serves the next client."""

import struct

import pytest

from test_oversized_frames import closed_within, tls

SASL = b"AMQP\x03\x01\x00\x00"
PLAIN = b"AMQP\x00\x01\x00\x00"

BAD_FRAMES = [struct.pack("!I", n) + bytes([2, 0, 0, 0])[: n - 4] for n in (4, 5, 6, 7)] + [
    struct.pack("!IBBH", 8, 0, 0, 0),   # data offset 0
    struct.pack("!IBBH", 8, 1, 1, 0),   # data offset 1
    struct.pack("!IBBH", 12, 4, 0, 0) + b"\x00" * 4,  # data offset 16 bytes in a 12-byte frame
]


def opens_sasl(hub) -> bool:
    """A new connection still gets the SASL header and the mechanisms frame."""
    s = tls(hub, hub.amqp_port)
    try:
        s.settimeout(5)
        s.sendall(SASL)
        got = b""
        while len(got) < 16:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        return got.startswith(SASL) and got[12:13] == b"\x02" and got[13:14] == b"\x01"
    finally:
        s.close()


@pytest.mark.parametrize("header", [SASL, PLAIN], ids=["sasl", "plain"])
def test_frames_shorter_than_their_header_close_the_connection_without_a_panic(hub, header):
    for frame in BAD_FRAMES:
        s = tls(hub, hub.amqp_port)
        s.settimeout(5)
        s.sendall(header)
        assert s.recv(8) == header
        s.sendall(frame)
        assert closed_within(s, 5), f"the hub kept a connection that sent {frame.hex()}"
        s.close()
    assert opens_sasl(hub)
    log = hub.stderr_path.read_text(errors="replace")
    assert "panicked" not in log, log[-3000:]
    assert hub.proc.poll() is None


def hub_rss_mib(hub) -> float:
    with open(f"/proc/{hub.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_sasl_frame_announcing_a_3_gb_string_is_refused_without_the_memory(hub):
    """A 50-byte SASL init whose mechanism is a str32 of length 0xb1b1b1b1 (found by the
    amqp_frames fuzz target): the AMQP library zero-filled a buffer of the announced length
    before reading, so each such frame cost the hub ~3 GB. Now the frame is refused on its
    structure; eight of them at once leave the hub's memory where it was."""
    before = hub_rss_mib(hub)
    frame = bytes.fromhex("00000032020100b1b1b1b1b1b1b1b1b1b1b1b101000003084043700001000070011402"
                          "0000000000696365732e6e65742f6d65")
    sockets = []
    for _ in range(8):
        s = tls(hub, hub.amqp_port)
        s.settimeout(5)
        s.sendall(SASL)
        assert s.recv(8) == SASL
        s.sendall(frame)
        sockets.append(s)
    for s in sockets:
        assert closed_within(s, 5), "the hub kept a connection that sent a malformed SASL frame"
        s.close()
    assert opens_sasl(hub)
    assert hub_rss_mib(hub) < before + 100, (before, hub_rss_mib(hub))
    assert hub.proc.poll() is None


def amqp_frame(body: bytes, frame_type: int = 0, channel: int = 0) -> bytes:
    return struct.pack("!IBBH", len(body) + 8, 2, frame_type, channel) + body


def described_list(code: int, fields: list[bytes]) -> bytes:
    items = b"".join(fields)
    return bytes([0x00, 0x53, code]) + b"\xd0" + struct.pack("!II", len(items) + 4, len(fields)) + items


def string(s: str, code=0xa1) -> bytes:
    b = s.encode()
    return bytes([code, len(b)]) + b


def read_frames(sock, until_performative: int, timeout: float = 5) -> bool:
    """Reads frames until one whose performative descriptor is `until_performative`."""
    sock.settimeout(timeout)
    data = b""
    while True:
        while len(data) >= 8 and data[:4] != b"AMQP" and len(data) >= struct.unpack("!I", data[:4])[0]:
            size = struct.unpack("!I", data[:4])[0]
            frame, data = data[:size], data[size:]
            body = frame[frame[4] * 4:]
            if body[:2] == b"\x00\x53" and body[2] == until_performative:
                return True
        if data[:4] == b"AMQP" and len(data) >= 8:
            data = data[8:]
            continue
        chunk = sock.recv(65536)
        if not chunk:
            return False
        data += chunk


def nested_value(levels: int) -> bytes:
    inner = b"\x45"
    for _ in range(levels):
        inner = b"\xd0" + struct.pack("!II", len(inner) + 4, 1) + inner
    return b"\x00\x53\x77" + inner


def test_a_deeply_nested_message_to_cbs_before_authentication_is_refused_and_the_hub_lives(hub):
    """One transfer to `$cbs` (which takes messages before the client authenticates) whose
    body is 7,000 nested lists: the AMQP library decodes message bodies recursively without a
    bound, which overflowed a 2 MiB worker stack and aborted the hub. The hub now checks a
    whole message's structure first (at most 32 levels) and closes the connection instead."""
    s = tls(hub, hub.amqp_port)
    s.settimeout(5)
    s.sendall(SASL)
    s.sendall(amqp_frame(described_list(0x41, [string("ANONYMOUS", 0xa3)]), frame_type=1))
    assert read_frames(s, 0x44), "no SASL outcome"
    s.sendall(PLAIN)
    s.sendall(amqp_frame(described_list(0x10, [string("attacker"), string("localhost")])))
    s.sendall(amqp_frame(described_list(0x11, [b"\x40", b"\x43", b"\x70\x00\x00\x10\x00", b"\x70\x00\x00\x10\x00"])))
    s.sendall(amqp_frame(described_list(0x12, [
        string("cbs-sender"), b"\x43", b"\x42",  # name, handle 0, role sender
        b"\x40", b"\x40",
        described_list(0x28, [string("cbs-sender")]),  # source
        described_list(0x29, [string("$cbs")]),  # target
        b"\x40", b"\x40", b"\x43"])))  # unsettled, incomplete-unsettled, initial-delivery-count
    assert read_frames(s, 0x13), "no flow (credit) for the $cbs link"
    message = nested_value(7000)
    assert len(message) < 65000
    s.sendall(amqp_frame(described_list(0x14, [b"\x43", b"\x43", b"\xa0\x01\x01", b"\x43", b"\x42", b"\x42"])
                         + message))
    assert closed_within(s, 5), "the hub kept the connection"
    s.close()
    assert hub.proc.poll() is None, "the hub died"
    assert opens_sasl(hub)
    log = hub.stderr_path.read_text(errors="replace")
    assert "overflowed its stack" not in log and "panicked" not in log, log[-3000:]
