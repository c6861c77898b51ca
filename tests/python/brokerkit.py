"""Real message brokers the routing tests publish to: a nats-server with JetStream (the pinned
binary scripts/lib.sh installs into $FERROHUB_NATS) and Debian's Mosquitto, each on its own
loopback port with credentials, stopped and started again on the same port and store (an
outage the hub must ride out).

    with NatsServer(tmp_path / "nats", user="hub", password="pw") as nats:
        nats.url  # nats://127.0.0.1:PORT
    with Mosquitto(tmp_path / "mosq", user="hub", password="pw") as mosq:
        mosq.port
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

NATS_BINARY = Path(os.environ.get("FERROHUB_NATS", Path.home() / ".cache" / "ferrohub" / "nats")) / "bin" / "nats-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, log: Path, timeout: float = 15.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the broker exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the broker does not listen on {port}: {log.read_text()[-2000:]}")


class Broker:
    """A broker process on one port that can be stopped and started again."""

    def __init__(self, work: Path):
        work.mkdir(parents=True, exist_ok=True)
        self.work = work
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = work / "broker.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self):
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT)
        wait_listening(self.port, self.proc, self.log)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *_):
        self.stop()


class NatsServer(Broker):
    """nats-server with JetStream, its store in `work`, one user."""

    def __init__(self, work: Path, user: str, password: str):
        super().__init__(work)
        self.user, self.password = user, password

    def command(self) -> list[str]:
        return [str(NATS_BINARY), "-a", "127.0.0.1", "-p", str(self.port), "-js",
                "-sd", str(self.work / "store"), "--user", self.user, "--pass", self.password]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


class Mosquitto(Broker):
    """Mosquitto with one user from a password file, anonymous clients refused."""

    def __init__(self, work: Path, user: str, password: str):
        super().__init__(work)
        passwords = work / "passwords"
        subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwords), user, password], check=True,
                       capture_output=True)
        passwords.chmod(0o600)
        self.conf = work / "mosquitto.conf"
        # Run as the invoking user: started as root, Mosquitto would drop to "mosquitto", which
        # cannot read files under the test's directory.
        self.conf.write_text(f"user {_user()}\n"
                             f"listener {self.port} 127.0.0.1\n"
                             "allow_anonymous false\n"
                             f"password_file {passwords}\n"
                             "persistence false\n"
                             # A fast publisher outruns a Python subscriber: queue for it
                             # rather than drop past Mosquitto's default 1,000.
                             "max_queued_messages 0\n")

    def command(self) -> list[str]:
        return ["mosquitto", "-c", str(self.conf)]


def _user() -> str:
    import pwd
    return pwd.getpwuid(os.getuid()).pw_name
