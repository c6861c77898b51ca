"""Azurite's blob service (the Azure Storage emulator) for the Event Hubs checkpoint-store tests.

The official Event Hubs SDKs keep checkpoints and partition ownership in blob storage, so suites
that exercise EventProcessorClient / BlobCheckpointStore against the hub's Event Hubs-compatible
endpoint need a blob account. Azurite is the Node package pinned in tests/node/package-lock.json
and installed into $FERROHUB_NODE by scripts/lib.sh (ensure_node_env).

Each instance gets its own workspace directory and an ephemeral port on loopback (Azurite is
started on port 0 and reports the port it bound), so suites can run in parallel:

    with Azurite(tmp_path / "azurite") as blob:
        blob.create_container("checkpoints")
        store = BlobCheckpointStore.from_connection_string(blob.connection_string, "checkpoints")
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

# Azurite's fixed development account; every storage SDK knows this key.
ACCOUNT_NAME = "devstoreaccount1"
ACCOUNT_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
               "K1SZFPTOtr/KBHBeksoGMGw==")

NODE_DIR = Path(os.environ.get("FERROHUB_NODE", Path.home() / ".cache" / "ferrohub" / "node"))

# Printed on stdout once the server is bound, even with --silent (which only mutes access logs).
_LISTENING = re.compile(r"listens on https?://[^\s:]+:(\d+)")


def azurite_blob_binary() -> Path:
    return NODE_DIR / "node_modules" / ".bin" / "azurite-blob"


class Azurite:
    """One azurite-blob process; start() is called by the context manager or by hand."""

    def __init__(self, location: Path, host: str = "127.0.0.1"):
        self.location = Path(location)
        self.host = host
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        # Beside the workspace, not in it, so the log survives Azurite wiping or locking its files.
        self.log_path = self.location.parent / (self.location.name + ".azurite.log")

    # -- process control -------------------------------------------------------------------
    def start(self, timeout: float = 30) -> "Azurite":
        binary = azurite_blob_binary()
        if not binary.exists():
            raise RuntimeError(f"azurite-blob not found at {binary}: run scripts/test-all.sh "
                               "(or `. scripts/lib.sh && ensure_node_env`)")
        self.location.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [str(binary),
                 "--blobHost", self.host,
                 # Port 0 lets the kernel choose and Azurite prints the result: no window in which
                 # a probed-then-released port can be taken by a parallel suite.
                 "--blobPort", "0",
                 "--location", str(self.location),
                 "--silent",
                 # The storage SDKs move to new x-ms-version values faster than Azurite releases;
                 # without this a newer client gets 400 InvalidHeaderValue.
                 "--skipApiVersionCheck",
                 # Ignore headers/parameters Azurite does not implement instead of failing.
                 "--loose",
                 # Telemetry is on by default and would make the tests talk to the internet.
                 "--disableTelemetry"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        finally:
            log.close()  # the child holds its own descriptor
        try:
            self.port = self._wait_for_port(time.monotonic() + timeout)
            self._wait_for_connect(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _wait_for_port(self, deadline: float) -> int:
        while True:
            m = _LISTENING.search(self._log_text())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                raise RuntimeError(f"azurite-blob exited with {self.proc.returncode} before listening; "
                                   f"log {self.log_path}:\n{self._log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"azurite-blob did not report a port; log {self.log_path}:\n"
                                   + self._log_text()[-3000:])
            time.sleep(0.05)

    def _wait_for_connect(self, deadline: float) -> None:
        # The log line comes from the listen callback, so this normally succeeds at once; it is
        # the guard against a future Azurite printing the line before the socket is ready.
        while True:
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"azurite-blob is not accepting connections on "
                                       f"{self.host}:{self.port}; log {self.log_path}:\n"
                                       + self._log_text()[-3000:])
                time.sleep(0.05)

    def stop(self, timeout: float = 10) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)

    def __enter__(self) -> "Azurite":
        return self.start() if self.proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- clients ---------------------------------------------------------------------------
    @property
    def blob_endpoint(self) -> str:
        if self.port is None:
            raise RuntimeError("Azurite is not started")
        # Path-style URL: the account is the first path segment, as Azurite expects on an IP host.
        return f"http://{self.host}:{self.port}/{ACCOUNT_NAME}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};AccountKey={ACCOUNT_KEY};"
                f"BlobEndpoint={self.blob_endpoint};")

    def create_container(self, name: str) -> None:
        """Creates a container; one that already exists is fine, so fixtures can share names."""
        # Imported here so that importing this module does not require azure-storage-blob.
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(self.connection_string) as service:
            try:
                service.create_container(name)
            except ResourceExistsError:
                pass
