"""A raw MQTT 3.1.1 client over QUIC on an independent stack (aioquic): one bidirectional
stream carries the MQTT bytes exactly as TLS does (docs/mqtt.md, EMQX's single-stream mode).
It is `mqttraw.RawMqtt` with another byte pipe: the same packets, reads and assertions.

aioquic is asyncio; the client runs its own event loop on a thread so tests stay synchronous.
`rebind()` moves the client to a new local UDP port mid-connection (connection migration).
`datagrams=True` advertises DATAGRAM support (RFC 9221) and counts the DATAGRAMs received;
`far_ms` holds every incoming packet that long, so the hub measures a distant device."""

import asyncio
import queue
import socket
import threading
import time

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, DatagramFrameReceived, StreamDataReceived

from mqttraw import Closed, RawMqtt


class _Protocol(QuicConnectionProtocol):
    def __init__(self, *args, far_s: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.incoming = queue.Queue()
        self.far_s = far_s
        self.datagrams = 0

    def datagram_received(self, data, addr):
        if self.far_s:
            self._loop.call_later(self.far_s, super().datagram_received, data, addr)
        else:
            super().datagram_received(data, addr)

    def quic_event_received(self, event):
        if isinstance(event, DatagramFrameReceived):
            self.datagrams += 1
        elif isinstance(event, StreamDataReceived):
            if event.data:
                self.incoming.put(event.data)
            if event.end_stream:
                self.incoming.put(None)
        elif isinstance(event, ConnectionTerminated):
            self.incoming.put(None)


def _bound_socket():
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", 0, 0, 0))
    return sock


class QuicMqtt(RawMqtt):
    def __init__(self, port: int, ca: str, host: str = "localhost", cert: str | None = None,
                 key: str | None = None, alpn: str = "mqtt", datagrams: bool = False,
                 far_ms: float = 0.0):
        self.buf = b""
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        config = QuicConfiguration(is_client=True, alpn_protocols=[alpn], server_name=host,
                                   max_datagram_frame_size=65536 if datagrams else None)
        config.load_verify_locations(ca)
        if cert:
            config.load_cert_chain(cert, key)
        self._context = connect("127.0.0.1", port, configuration=config,
                                create_protocol=lambda *a, **k: _Protocol(*a, far_s=far_ms / 1000, **k))
        self.protocol = self._call(self._context.__aenter__())
        self.stream = self.protocol._quic.get_next_available_stream_id()

    def _call(self, coro, timeout=10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _in_loop(self, fn):
        async def run():
            return fn()
        return self._call(run())

    def send(self, data: bytes):
        def write():
            self.protocol._quic.send_stream_data(self.stream, data)
            self.protocol.transmit()
        self._in_loop(write)

    def send_datagram(self, data: bytes):
        def write():
            self.protocol._quic.send_datagram_frame(data)
            self.protocol.transmit()
        self._in_loop(write)

    def datagrams_received(self) -> int:
        return self._in_loop(lambda: self.protocol.datagrams)

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            try:
                chunk = self.protocol.incoming.get(timeout=max(0.01, deadline - time.time()))
            except queue.Empty:
                raise TimeoutError
            if chunk is None:
                self.protocol.incoming.put(None)
                raise Closed("stream or connection closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def local_port(self) -> int:
        return self._in_loop(lambda: self.protocol._transport.get_extra_info("sockname")[1])

    def rebind(self):
        """Sends from a new UDP socket (a new local port) from now on, as after a NAT rebinding
        or a network change; the old socket is closed."""
        async def move():
            old = self.protocol._transport
            await self.loop.create_datagram_endpoint(lambda: self.protocol, sock=_bound_socket())
            old.close()
            self.protocol.transmit()
        self._call(move())

    def close(self):
        try:
            self._call(self._context.__aexit__(None, None, None), timeout=5)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)


def connect_quic_device(hub, device_id, password=None, keepalive=60, clean=False, **kw):
    """A QuicMqtt connected as a device with a valid SAS token unless overridden; returns the
    client and the CONNACK return code."""
    c = QuicMqtt(hub.quic_port, hub.ca, **kw)
    username = f"localhost/{device_id}/?api-version=2021-04-12"
    _, code = c.connect(device_id, username=username,
                        password=hub.device_token(device_id) if password is None else password,
                        keepalive=keepalive, clean=clean)
    return c, code
