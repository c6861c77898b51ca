"""What a new user meets first: a port in use is reported before a new data directory is
initialised (no hub left behind, no keys printed), and the hub's root URL leads to the console."""

import socket
import subprocess

import requests

from hubkit import binary


def test_a_port_in_use_is_found_before_the_data_directory_is_initialised(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        fresh = tmp_path / "fresh"
        out = subprocess.run(
            [binary(), "serve", "--data-dir", str(fresh), "--https-addr", f"127.0.0.1:{port}",
             "--mqtt-addr", "127.0.0.1:0", "--amqp-addr", "127.0.0.1:0", "--mqtt-quic-addr", "127.0.0.1:0",
             "--metrics-addr", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
    assert out.returncode != 0
    assert f"127.0.0.1:{port}" in out.stderr and "in use" in out.stderr.lower(), out.stderr
    assert "SharedAccessKey" not in out.stdout, "no keys printed for a hub that did not start"
    assert not (fresh / "db").exists() and not (fresh / "tls").exists(), "nothing initialised"


def test_the_root_url_leads_to_the_console(hub):
    r = requests.get(f"https://localhost:{hub.port}/", verify=hub.ca, allow_redirects=False, timeout=10)
    assert r.status_code == 301 and r.headers["Location"] == "/console/", (r.status_code, r.headers)
    followed = requests.get(f"https://localhost:{hub.port}/", verify=hub.ca, timeout=10)
    assert followed.status_code == 200 and "ferrohub console" in followed.text
    # Only the root: any other unknown path is still the REST API's 404.
    assert requests.get(f"https://localhost:{hub.port}/nothing-here", verify=hub.ca, timeout=10).status_code == 404
