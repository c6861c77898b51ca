"""SEC-5, P-2: HTTPS offers TLS 1.2 and 1.3 with a certificate for localhost, 127.0.0.1 and ::1
issued by the hub's own CA; nothing is served in plain text."""

import socket
import ssl

import pytest


def handshake(hub, version, host="localhost", server_hostname="localhost"):
    ctx = ssl.create_default_context(cafile=hub.ca)
    ctx.minimum_version = version
    ctx.maximum_version = version
    with socket.create_connection((host, hub.port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
            return tls.version()


@pytest.mark.parametrize("version,name", [(ssl.TLSVersion.TLSv1_2, "TLSv1.2"), (ssl.TLSVersion.TLSv1_3, "TLSv1.3")])
def test_both_tls_versions(hub, version, name):
    assert handshake(hub, version) == name


def test_certificate_names(hub):
    assert handshake(hub, ssl.TLSVersion.TLSv1_2, host="127.0.0.1", server_hostname="127.0.0.1") == "TLSv1.2"
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(hub, ssl.TLSVersion.TLSv1_2, server_hostname="not-this-hub.example")


def test_plain_http_is_not_served(hub):
    with socket.create_connection(("127.0.0.1", hub.port), timeout=10) as s:
        s.sendall(b"GET /devices HTTP/1.1\r\nHost: localhost\r\n\r\n")
        s.settimeout(10)
        try:
            data = s.recv(4096)
        except (ConnectionResetError, socket.timeout):
            data = b""
    assert b"HTTP/1.1 200" not in data and b"deviceId" not in data
