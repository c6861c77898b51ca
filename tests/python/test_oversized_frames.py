"""Oversized frames on every protocol (issue 18, part 4): a frame whose header announces more
than the protocol's limit is refused on the header alone. The test sends only the header and
waits: an answer (close or 413) proves the hub did not wait to buffer the announced bytes."""

import base64
import os
import socket
import ssl
import struct
import time

from mqttraw import _remaining, connect_device


def tls(hub, port):
    ctx = ssl.create_default_context(cafile=hub.ca)
    return ctx.wrap_socket(socket.create_connection(("localhost", port), timeout=10), server_hostname="localhost")


def closed_within(sock, seconds: float) -> bool:
    """Whether the peer closes within `seconds` (reading and discarding what it sends)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            if sock.recv(65536) == b"":
                return True
        except socket.timeout:
            return False
        except (ConnectionResetError, ssl.SSLError, OSError):
            return True
    return False


def test_an_mqtt_packet_announcing_more_than_the_limit_is_refused_on_its_header(hub):
    hub.create_device("big")
    c = connect_device(hub, "big")
    c.send(bytes([0x32]) + _remaining(10 * 1024 * 1024))  # PUBLISH QoS 1, 10 MB announced.
    assert closed_within(c.sock, 5), "the hub waited for a 10 MB packet"
    assert "exceeds the limit" in hub.stderr_path.read_text()
    # The device can come back and is served.
    again = connect_device(hub, "big")
    again.publish("devices/big/messages/events/", b"small", qos=1, pkid=2)
    again.expect_puback(2)
    again.close()


def websocket(hub, path: str, protocol: str):
    s = tls(hub, hub.port)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(4096)
    assert head.startswith(b"HTTP/1.1 101"), head
    return s


def test_a_websocket_frame_announcing_more_than_the_limit_is_refused_on_its_header(hub):
    for path, protocol in (("/$iothub/websocket", "mqtt"), ("/$servicebus/websocket", "AMQPWSB10")):
        s = websocket(hub, path, protocol)
        # A masked binary frame announcing 2 MB: beyond the protocol's limit, well within the
        # WebSocket library's default frame limit of 16 MB.
        s.sendall(bytes([0x82, 0x80 | 127]) + struct.pack("!Q", 2 << 20) + os.urandom(4))
        assert closed_within(s, 5), f"{path}: the hub waited for a 2 MB frame"
        s.close()


def test_an_http_body_announcing_more_than_the_limit_is_refused_before_it_is_sent(hub):
    s = tls(hub, hub.port)
    token = hub.token()
    s.sendall((f"PUT /devices/huge?api-version=2021-04-12 HTTP/1.1\r\nHost: localhost\r\nAuthorization: {token}\r\n"
               "Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n").encode())
    s.settimeout(5)
    answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    s.close()
    assert hub.request("GET", "/devices/huge", hub.token()).status_code == 404


def test_an_amqp_frame_announcing_more_than_the_limit_is_refused_on_its_header(hub):
    s = tls(hub, hub.amqp_port)
    s.sendall(b"AMQP\x03\x01\x00\x00")  # SASL layer.
    s.settimeout(5)
    assert s.recv(8) == b"AMQP\x03\x01\x00\x00"
    # A frame announcing 256 MB (size, data offset 2, type 1 = SASL).
    s.sendall(struct.pack("!IBBH", 256 << 20, 2, 1, 0))
    assert closed_within(s, 5), "the hub waited for a 256 MB AMQP frame"
    s.close()
