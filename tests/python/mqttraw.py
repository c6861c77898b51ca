"""A raw MQTT 3.1.1 client over TLS for compliance tests: exact packets, no retries, no hidden
keep-alive, so a test sees precisely what the hub does."""

import socket
import ssl
import struct
import time

CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = \
    1, 2, 3, 4, 8, 9, 10, 11, 12, 13, 14


def _str(s) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


def _remaining(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def packet(ptype: int, flags: int, body: bytes) -> bytes:
    return bytes([(ptype << 4) | flags]) + _remaining(len(body)) + body


class Closed(Exception):
    pass


class RawMqtt:
    def __init__(self, port: int, ca: str, host: str = "localhost", source: str | None = None):
        """`source` binds the client's address (say 127.0.0.5: another client, as the hub sees it)."""
        ctx = ssl.create_default_context(cafile=ca)
        raw = socket.create_connection((host, port), timeout=10, source_address=(source, 0) if source else None)
        self.sock = ctx.wrap_socket(raw, server_hostname=host)
        self.buf = b""

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data: bytes):
        self.sock.sendall(data)

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            self.sock.settimeout(max(0.01, deadline - time.time()))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError
            except (ConnectionResetError, ssl.SSLError, OSError) as e:
                raise Closed(str(e))
            if not chunk:
                raise Closed("eof")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read(self, timeout: float = 10):
        """Next packet as (type, flags, body); raises Closed when the hub closed the connection."""
        deadline = time.time() + timeout
        first = self._recv_exact(1, deadline)[0]
        mult, length = 1, 0
        while True:
            b = self._recv_exact(1, deadline)[0]
            length += (b & 0x7F) * mult
            mult *= 128
            if not b & 0x80:
                break
        return first >> 4, first & 0x0F, self._recv_exact(length, deadline)

    def wait_closed(self, timeout: float = 10) -> bool:
        """True if the hub closes the connection within `timeout` (packets before that are skipped)."""
        deadline = time.time() + timeout
        try:
            while time.time() < deadline:
                self.read(deadline - time.time())
        except Closed:
            return True
        except TimeoutError:
            return False
        return False

    # -- packets -----------------------------------------------------------------------------
    def connect(self, client_id, username=None, password=None, clean=False, keepalive=60, will=None, level=4):
        self.send_connect(client_id, username, password, clean, keepalive, will, level)
        return self.read_connack()

    def read_connack(self):
        ptype, _, body = self.read()
        assert ptype == CONNACK, ptype
        return bool(body[0] & 1), body[1]

    def send_connect(self, client_id, username=None, password=None, clean=False, keepalive=60, will=None, level=4):
        """Sends a CONNECT without waiting for its CONNACK (read_connack reads it)."""
        flags = 0 if not clean else 0x02
        payload = _str(client_id)
        if will:
            topic, message, qos, retain = will
            flags |= 0x04 | (qos << 3) | (0x20 if retain else 0)
            payload += _str(topic) + _str(message)
        if username is not None:
            flags |= 0x80
            payload += _str(username)
        if password is not None:
            flags |= 0x40
            payload += _str(password)
        body = _str("MQTT") + bytes([level, flags]) + struct.pack("!H", keepalive) + payload
        self.send(packet(CONNECT, 0, body))

    def publish(self, topic, payload=b"", qos=0, pkid=1, retain=False, dup=False):
        flags = (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
        body = _str(topic) + (struct.pack("!H", pkid) if qos else b"") + (payload.encode() if isinstance(payload, str) else payload)
        self.send(packet(PUBLISH, flags, body))

    def expect_puback(self, pkid, timeout=10):
        ptype, _, body = self.read(timeout)
        assert ptype == PUBACK, f"expected PUBACK, got type {ptype}"
        assert struct.unpack("!H", body)[0] == pkid
        return True

    def subscribe(self, filters, pkid=1):
        body = struct.pack("!H", pkid) + b"".join(_str(f) + bytes([q]) for f, q in filters)
        self.send(packet(SUBSCRIBE, 2, body))
        ptype, _, body = self.read()
        assert ptype == SUBACK, ptype
        assert struct.unpack("!H", body[:2])[0] == pkid
        return list(body[2:])

    def ping(self):
        self.send(packet(PINGREQ, 0, b""))
        ptype, _, _ = self.read()
        assert ptype == PINGRESP

    def disconnect(self):
        self.send(packet(DISCONNECT, 0, b""))


def connect_device(hub, device_id, module_id=None, clean=False, keepalive=60, will=None, password=None, username=None):
    """A RawMqtt connected as a device (or module) with a valid SAS token unless overridden."""
    c = RawMqtt(hub.mqtt_port, hub.ca)
    client_id = f"{device_id}/{module_id}" if module_id else device_id
    if username is None:
        username = f"localhost/{client_id}/?api-version=2021-04-12"
    if password is None:
        password = hub.device_token(device_id, module_id)
    present, rc = c.connect(client_id, username, password, clean=clean, keepalive=keepalive, will=will)
    assert rc == 0, f"CONNACK {rc}"
    return c
