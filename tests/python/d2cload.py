"""Load shapes for the D2C fair-share test and benchmark (THR-2): quiet devices sending one QoS 1
message a second and timing each PUBACK, and a flooder publishing as fast as its PUBACKs allow.
Raw MQTT over TLS, one thread per device; every loop stops at `until`."""

import random
import threading
import time

from mqttraw import Closed, RawMqtt, connect_device


class Quiet(threading.Thread):
    """A device sending one QoS 1 message a second, timing each PUBACK."""

    def __init__(self, hub, device_id, until):
        super().__init__(daemon=True)
        self.hub, self.device_id, self.until = hub, device_id, until
        self.latencies, self.failures = [], []

    def run(self):
        c = connect_device(self.hub, self.device_id)
        # Devices are not phase-locked: each starts somewhere in the first second.
        pkid, next_at = 1, time.time() + random.random()
        try:
            while next_at < self.until:
                time.sleep(max(0.0, next_at - time.time()))
                sent_at = time.time()
                try:
                    c.publish(f"devices/{self.device_id}/messages/events/", b"q", qos=1, pkid=pkid)
                    c.expect_puback(pkid, timeout=5)
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

    def __init__(self, hub, device_id, until):
        super().__init__(daemon=True)
        self.hub, self.device_id, self.until = hub, device_id, until
        self.acked, self.disconnects, self.refused_connects = 0, 0, 0

    def run(self):
        while time.time() < self.until:
            c = RawMqtt(self.hub.mqtt_port, self.hub.ca)
            try:
                _, rc = c.connect(self.device_id, f"localhost/{self.device_id}/?api-version=2021-04-12",
                                  self.hub.device_token(self.device_id))
                if rc != 0:
                    assert rc == 3, rc
                    self.refused_connects += 1
                    time.sleep(0.2)
                    continue
                pkid = 1
                while time.time() < self.until:
                    c.publish(f"devices/{self.device_id}/messages/events/", b"f" * 64, qos=1, pkid=pkid)
                    c.expect_puback(pkid, timeout=10)
                    self.acked += 1
                    pkid = pkid % 60000 + 1
            except (Closed, TimeoutError):
                self.disconnects += 1
            finally:
                c.close()
