"""A webhook receiver and endpoint for the tests of webhook endpoints (test_routing_webhook.py,
test_routing_backlog.py): a real HTTPS server on 127.0.0.1 with a CA of the test's own."""

from __future__ import annotations

import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import certs


class Receiver:
    """An HTTPS webhook receiver on 127.0.0.1: records POSTs; `status` decides the answer."""

    def __init__(self, work: Path, port: int = 0):
        work.mkdir(parents=True, exist_ok=True)
        if not (work / "hook-ca.pem").exists():
            self.ca_cert, self.ca_key = certs.ca(work, "hook")
            self.cert, self.key = certs.server_signed_by(work, "receiver", ["127.0.0.1", "localhost"],
                                                         self.ca_cert, self.ca_key)
        else:
            self.ca_cert, self.cert, self.key = work / "hook-ca.pem", work / "receiver.pem", work / "receiver.key"
        self.posts: list[dict] = []
        self.status = 200
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = receiver.status
                if status == 200:
                    with receiver.lock:
                        receiver.posts.append({"headers": {k.lower(): v for k, v in self.headers.items()},
                                               "body": body})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                if status != 200:
                    # A refusing (or closed) receiver drops the connection: the hub's next
                    # attempt connects anew, to whatever listens then.
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.cert), str(self.key))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/hook"

    def close(self):
        self.status = 503  # kept-alive connections the server no longer owns answer so and close
        self.server.shutdown()
        self.server.server_close()

    def received(self) -> list[dict]:
        with self.lock:
            return list(self.posts)


def webhook(receiver: Receiver, key: str, **extra) -> dict:
    return {"url": receiver.url, "signingKey": key, "caCertificate": receiver.ca_cert.read_text(),
            "timeoutSeconds": 2, **extra}


def put_webhook_endpoint(hub, name: str, hook: dict, partitions: int = 2) -> dict:
    r = hub.request("PUT", f"/routing/endpoints/{name}", hub.token(),
                    json={"partitionCount": partitions, "webhook": hook})
    assert r.status_code == 201, r.text
    return r.json()
