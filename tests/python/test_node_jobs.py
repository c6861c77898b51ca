"""JOB-1..JOB-4 through the unmodified official Node service SDK (azure-iothub's Registry):
`exportDevicesToBlob` and `importDevicesFromBlob` against Azurite and a `file://` directory,
`cancelJob`, and the refusal of a second job. The SDK runs in tests/node/registry_jobs.js and
reaches the hub on port 443, so this module uses the fixed-port hub."""

import json
import subprocess

from azurite import Azurite
from hubkit import REPO
from jobkit import azurite_container, file_uri, read_lines, write_lines
from test_node_sdk import node_env

SCRIPT = str(REPO / "tests" / "node" / "registry_jobs.js")
KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="


def registry_jobs(hub, request, timeout=180):
    request = dict(request, connectionString=hub.connection_string("iothubowner", with_port=False))
    done = subprocess.run(["node", SCRIPT], input=json.dumps(request), capture_output=True, text=True,
                          timeout=timeout, env=node_env(hub))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_node_export_and_import_through_azurite_and_a_directory(sdk_hub, tmp_path):
    sdk_hub.create_device("node-exp-1", authentication={"type": "sas", "symmetricKey": {"primaryKey": KEY, "secondaryKey": KEY}})
    sdk_hub.create_module("node-exp-1", "m")
    assert sdk_hub.request("PATCH", "/twins/node-exp-1", sdk_hub.token(), headers={"If-Match": "*"},
                           json={"tags": {"owner": "node"}}).status_code == 200
    with Azurite(tmp_path / "azurite") as blob:
        out_uri, out = azurite_container(blob, "node-export")
        result = registry_jobs(sdk_hub, {"op": "export", "outputUri": out_uri, "excludeKeys": False})
        assert result["created"]["status"] == "queued" and result["created"]["type"] == "export"
        assert result["job"]["status"] == "completed" and result["job"]["progress"] == 100, result["job"]
        assert result["job"]["jobId"] in [j["jobId"] for j in result["jobs"]]
        exported = read_lines(out.download_blob("devices.txt").readall().decode())
        mine = [l for l in exported if l["id"] == "node-exp-1"]
        assert [l.get("moduleId") for l in mine] == [None, "m"]
        assert mine[0]["authentication"]["symmetricKey"]["primaryKey"] == KEY and mine[0]["tags"] == {"owner": "node"}

        in_uri, inp = azurite_container(blob, "node-import")
        lines = [{"id": "node-imp-1", "tags": {"from": "azurite"}}, {"id": "node-exp-1", "importMode": "create"}, "not json"]
        inp.upload_blob("devices.txt", "\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n")
        result = registry_jobs(sdk_hub, {"op": "import", "inputUri": in_uri, "outputUri": out_uri})
        assert result["job"]["status"] == "completed", result["job"]
        errors = read_lines(out.download_blob("importErrors.log").readall().decode())
        assert sorted(e["lineNumber"] for e in errors) == [2, 3]
        assert sdk_hub.request("GET", "/twins/node-imp-1", sdk_hub.token()).json()["tags"] == {"from": "azurite"}

    result = registry_jobs(sdk_hub, {"op": "export", "outputUri": file_uri(tmp_path / "dir"), "excludeKeys": True})
    assert result["job"]["status"] == "completed"
    lines = read_lines((tmp_path / "dir" / "devices.txt").read_text())
    assert {"node-exp-1", "node-imp-1"} <= {l["id"] for l in lines}
    assert all(l["authentication"] is None for l in lines)


def test_node_cancel_and_second_job_refused(sdk_hub, tmp_path):
    write_lines(tmp_path / "in" / "devices.txt", ({"id": f"node-bulk-{i:06d}"} for i in range(100_000)))
    result = registry_jobs(sdk_hub, {"op": "cancel", "inputUri": file_uri(tmp_path / "in"),
                                     "outputUri": file_uri(tmp_path / "out")})
    assert result["second"] is not None and result["second"]["statusCode"] == 403, result["second"]
    assert "JobQuotaExceeded" in result["second"]["error"] or result["second"]["statusCode"] == 403
    assert result["job"]["status"] == "cancelled", result["job"]
    total = sdk_hub.request("GET", "/statistics/devices", sdk_hub.token()).json()["totalDeviceCount"]
    assert total < 100_000
