"""Load shapes for the D2C fair-share test and benchmark (THR-2): quiet devices sending one QoS 1
message a second and timing each PUBACK, and a flooder publishing as fast as its PUBACKs allow.
Raw MQTT over TLS, one thread per device. The load runs in a `Window` that opens once every
device has connected (a hundred TLS handshakes from one Python process take seconds on a busy
machine) and closes by itself."""

import random
import threading
import time

from mqttraw import Closed, RawMqtt, connect_device


class Window:
    """The load's time window, shared by its devices: it opens when the last of `parties` is
    connected and lasts `seconds`."""

    def __init__(self, parties: int, seconds: float):
        self.seconds = seconds
        self.until = None
        self.barrier = threading.Barrier(parties, action=self._open)

    def _open(self):
        self.until = time.time() + self.seconds

    def wait(self, timeout: float = 300) -> float:
        """Waits for every device to connect; returns when the window closes (epoch seconds)."""
        self.barrier.wait(timeout)
        return self.until


class Quiet(threading.Thread):
    """A device sending one QoS 1 message a second, timing each PUBACK. `failures` holds what
    ended its loop early: a PUBACK not seen within `puback_timeout`, or the connection closed."""

    def __init__(self, hub, device_id, window: Window, puback_timeout: float = 5):
        super().__init__(daemon=True)
        self.hub, self.device_id, self.window = hub, device_id, window
        self.puback_timeout = puback_timeout
        self.latencies, self.failures = [], []

    def run(self):
        c = connect_device(self.hub, self.device_id)
        until = self.window.wait()
        # Devices are not phase-locked: each starts somewhere in the first second.
        pkid, next_at = 1, time.time() + random.random()
        try:
            while next_at < until:
                time.sleep(max(0.0, next_at - time.time()))
                sent_at = time.time()
                try:
                    c.publish(f"devices/{self.device_id}/messages/events/", b"q", qos=1, pkid=pkid)
                    c.expect_puback(pkid, timeout=self.puback_timeout)
                    self.latencies.append(time.time() - sent_at)
                except (TimeoutError, Closed, AssertionError) as e:
                    self.failures.append(repr(e))
                    return
                pkid = pkid % 60000 + 1
                next_at += 1.0
        finally:
            c.close()


class Flooder(threading.Thread):
    """A device publishing as fast as its PUBACKs allow, reconnecting when it is refused."""

    def __init__(self, hub, device_id, window: Window):
        super().__init__(daemon=True)
        self.hub, self.device_id, self.window = hub, device_id, window
        self.acked, self.disconnects, self.refused_connects = 0, 0, 0

    def connect(self):
        """A new connection and its CONNACK's return code."""
        c = RawMqtt(self.hub.mqtt_port, self.hub.ca)
        _, rc = c.connect(self.device_id, f"localhost/{self.device_id}/?api-version=2021-04-12",
                          self.hub.device_token(self.device_id))
        return c, rc

    def run(self):
        # The first connection counts among the window's devices, as a quiet device's does.
        c, rc = self.connect()
        assert rc == 0, rc
        until = self.window.wait()
        while c is not None:
            try:
                pkid = 1
                while time.time() < until:
                    c.publish(f"devices/{self.device_id}/messages/events/", b"f" * 64, qos=1, pkid=pkid)
                    c.expect_puback(pkid, timeout=10)
                    self.acked += 1
                    pkid = pkid % 60000 + 1
            except (Closed, TimeoutError):
                self.disconnects += 1
            finally:
                c.close()
            c = None
            while c is None and time.time() < until:
                try:
                    c, rc = self.connect()
                except (Closed, TimeoutError, OSError):
                    self.disconnects += 1
                    continue
                if rc != 0:
                    assert rc == 3, rc
                    self.refused_connects += 1
                    c.close()
                    c = None
                    time.sleep(0.2)
