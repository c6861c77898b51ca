"""JOB-1..JOB-4 through the unmodified official service SDK (azure-iot-hub):
`IoTHubJobManager.create_import_export_job` runs export and import jobs against a `file://`
directory and against Azurite (container SAS URIs); every importMode of seed 002, etag
mismatches, bad lines logged to importErrors.log, cancel, one job at a time, and a hub killed
during an import."""

import base64
import json
import os
import signal

import pytest
from azure.iot.hub import IoTHubJobManager, IoTHubRegistryManager
from azure.iot.hub.models import JobProperties
from msrest.exceptions import HttpOperationError

from azurite import Azurite
from hubkit import Hub
from jobkit import azurite_container, file_uri, read_lines, wait_job, write_lines

KEY_A = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="


def managers(hub, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", hub.ca)
    cs = hub.connection_string("iothubowner")
    jobs = IoTHubJobManager.from_connection_string(cs)
    registry = IoTHubRegistryManager.from_connection_string(cs)
    for m in (jobs, registry):
        m.protocol.config.connection.verify = hub.ca
    return jobs, registry


def run_job(jobs, props, timeout=120):
    created = jobs.create_import_export_job(props)
    assert created.status == "queued" and created.job_id
    seen = []
    done = wait_job(jobs.get_import_export_job, created.job_id, timeout, seen)
    return done, seen


def export_props(uri, exclude_keys=False):
    return JobProperties(type="export", output_blob_container_uri=uri, exclude_keys_in_export=exclude_keys)


def import_props(inp, out):
    return JobProperties(type="import", input_blob_container_uri=inp, output_blob_container_uri=out)


def seed_devices(hub):
    token = hub.token()
    hub.create_device("exp-sas", authentication={"type": "sas", "symmetricKey": {"primaryKey": KEY_A, "secondaryKey": KEY_A}})
    hub.create_device("exp-x509", authentication={"type": "selfSigned", "x509Thumbprint": {"primaryThumbprint": "A" * 40}})
    hub.create_module("exp-sas", "mod1")
    r = hub.request("PATCH", "/twins/exp-sas", token, headers={"If-Match": "*"},
                    json={"tags": {"site": "lyon"}, "properties": {"desired": {"interval": 5}}})
    assert r.status_code == 200, r.text


def test_export_to_a_directory_with_and_without_keys(hub, tmp_path, monkeypatch):
    jobs, registry = managers(hub, monkeypatch)
    seed_devices(hub)
    done, seen = run_job(jobs, export_props(file_uri(tmp_path / "out")))
    assert done.status == "completed" and done.progress == 100, done.failure_reason
    assert seen[-1] == "completed" and set(seen) <= {"queued", "running", "completed"}
    assert done.start_time_utc and done.end_time_utc and done.end_time_utc >= done.start_time_utc
    lines = read_lines((tmp_path / "out" / "devices.txt").read_text())
    by_id = {(l["id"], l.get("moduleId")): l for l in lines}
    assert set(by_id) == {("exp-sas", None), ("exp-sas", "mod1"), ("exp-x509", None)}
    assert [(l["id"], l.get("moduleId")) for l in lines][:2] == [("exp-sas", None), ("exp-sas", "mod1")], "a device, then its modules"
    sas = by_id[("exp-sas", None)]
    device = registry.get_device("exp-sas")
    assert sas["eTag"] == device.etag and sas["status"] == "enabled"
    assert sas["authentication"]["symmetricKey"]["primaryKey"] == KEY_A
    assert sas["tags"] == {"site": "lyon"}
    assert sas["properties"]["desired"]["interval"] == 5 and sas["properties"]["desired"]["$version"] == 2
    assert by_id[("exp-x509", None)]["authentication"]["x509Thumbprint"]["primaryThumbprint"] == "A" * 40
    # excludeKeysInExport: authentication is null on every line (seed 002).
    done, _ = run_job(jobs, export_props(file_uri(tmp_path / "nokeys"), exclude_keys=True))
    assert done.status == "completed"
    assert all(l["authentication"] is None for l in read_lines((tmp_path / "nokeys" / "devices.txt").read_text()))
    listed = jobs.get_import_export_jobs()
    assert len(listed) == 2 and all(j.status == "completed" for j in listed)
    with pytest.raises(HttpOperationError) as missing:
        jobs.get_import_export_job("no-such-job")
    assert missing.value.response.status_code == 404


def test_every_import_mode_and_bad_lines(hub, tmp_path, monkeypatch):
    jobs, registry = managers(hub, monkeypatch)
    for d in ("keep", "upd", "upd-etag", "upd-etag-bad", "cou-etag", "cou-etag-bad", "del", "del-etag", "del-etag-bad", "exists"):
        hub.create_device(d)
    etag = lambda d: registry.get_device(d).etag
    lines = [
        {"id": "new-default", "tags": {"t": 1}, "properties": {"desired": {"d": 1}}},              # 1 createOrUpdate: created
        {"id": "new-create", "importMode": "create", "status": "disabled"},                        # 2 created
        {"id": "exists", "importMode": "create"},                                                  # 3 error: exists
        {"id": "upd", "importMode": "update", "status": "disabled", "statusReason": "r"},          # 4 updated
        {"id": "missing-upd", "importMode": "update"},                                             # 5 error: absent
        {"id": "upd-etag", "importMode": "updateIfMatchETag", "eTag": etag("upd-etag"), "tags": {"m": "ok"}},  # 6 updated
        {"id": "upd-etag-bad", "importMode": "updateIfMatchETag", "eTag": "bm9wZQ==", "tags": {"m": "no"}},    # 7 error: etag
        {"id": "cou-etag", "importMode": "createOrUpdateIfMatchETag", "eTag": etag("cou-etag"), "status": "disabled"},  # 8
        {"id": "cou-etag-bad", "importMode": "createOrUpdateIfMatchETag", "eTag": "bm9wZQ==", "status": "disabled"},   # 9 error
        {"id": "cou-new", "importMode": "createOrUpdateIfMatchETag"},                              # 10 created
        {"id": "del", "importMode": "delete"},                                                     # 11 deleted
        {"id": "missing-del", "importMode": "delete"},                                             # 12 error: absent
        {"id": "del-etag", "importMode": "deleteIfMatchETag", "eTag": etag("del-etag")},           # 13 deleted
        {"id": "del-etag-bad", "importMode": "deleteIfMatchETag", "eTag": "bm9wZQ=="},             # 14 error: etag
        "{this is not json",                                                                       # 15 error
        {"id": "bad id with spaces"},                                                              # 16 error
        {"id": "weird-mode", "importMode": "merge"},                                               # 17 error
        {"id": "new-create", "moduleId": "m1", "importMode": "create"},                            # 18 module created
        {"id": "keyed", "authentication": {"type": "sas", "symmetricKey": {"primaryKey": KEY_A, "secondaryKey": KEY_A}}},  # 19
    ]
    inp = tmp_path / "in"
    write_lines(inp / "devices.txt", lines)
    done, _ = run_job(jobs, import_props(file_uri(inp), file_uri(tmp_path / "out")))
    assert done.status == "completed" and done.progress == 100, done.failure_reason
    errors = read_lines((tmp_path / "out" / "importErrors.log").read_text())
    assert sorted(e["lineNumber"] for e in errors) == [3, 5, 7, 9, 12, 14, 15, 16, 17]
    by_line = {e["lineNumber"]: e for e in errors}
    assert by_line[3]["errorCode"] == "409001" and by_line[3]["deviceId"] == "exists"
    assert by_line[5]["errorCode"] == "404001"
    assert by_line[7]["errorCode"] == "412001" and by_line[7]["importMode"] == "updateIfMatchETag"
    assert by_line[9]["errorCode"] == "412001"
    assert by_line[14]["errorCode"] == "412001"
    assert by_line[17]["deviceId"] == "weird-mode" and "merge" in by_line[17]["errorStatus"]

    def twin(d):
        return hub.request("GET", f"/twins/{d}", hub.token()).json()

    def status(d):
        r = hub.request("GET", f"/devices/{d}", hub.token())
        return r.json()["status"] if r.status_code == 200 else None

    assert twin("new-default")["tags"] == {"t": 1} and twin("new-default")["properties"]["desired"]["d"] == 1
    assert status("new-create") == "disabled"
    assert status("upd") == "disabled" and registry.get_device("upd").status_reason == "r"
    assert twin("upd-etag")["tags"] == {"m": "ok"}
    assert twin("upd-etag-bad")["tags"] == {} and status("upd-etag-bad") == "enabled"
    assert status("cou-etag") == "disabled" and status("cou-etag-bad") == "enabled"
    assert status("cou-new") == "enabled"
    assert status("del") is None and status("del-etag") is None and status("del-etag-bad") == "enabled"
    assert status("bad id with spaces".replace(" ", "%20")) is None
    assert status("weird-mode") is None and status("missing-upd") is None
    assert status("keep") == "enabled", "lines never named are untouched"
    assert registry.get_module("new-create", "m1").module_id == "m1"
    assert registry.get_device("keyed").authentication.symmetric_key.primary_key == KEY_A


def test_export_and_import_through_azurite(hub, tmp_path, monkeypatch):
    jobs, registry = managers(hub, monkeypatch)
    seed_devices(hub)
    with Azurite(tmp_path / "azurite") as blob:
        out_uri, out = azurite_container(blob, "exports")
        done, _ = run_job(jobs, export_props(out_uri))
        assert done.status == "completed", done.failure_reason
        exported = read_lines(out.download_blob("devices.txt").readall().decode())
        assert {l["id"] for l in exported} == {"exp-sas", "exp-x509"}
        # Import what was exported, under new names, from another container.
        in_uri, inp = azurite_container(blob, "imports")
        renamed = [dict(l, id="copy-" + l["id"], importMode="create") for l in exported]
        inp.upload_blob("devices.txt", "\n".join(json.dumps(l) for l in renamed) + "\n")
        logs_uri, logs = azurite_container(blob, "logs")
        done, _ = run_job(jobs, import_props(in_uri, logs_uri))
        assert done.status == "completed", done.failure_reason
        assert logs.download_blob("importErrors.log").readall() == b""
        copy = registry.get_device("copy-exp-sas")
        assert copy.authentication.symmetric_key.primary_key == KEY_A
        assert registry.get_module("copy-exp-sas", "mod1").module_id == "mod1"
        assert hub.request("GET", "/twins/copy-exp-sas", hub.token()).json()["tags"] == {"site": "lyon"}
        # A SAS without write access: the job fails with the store's refusal as its reason.
        read_only = out_uri.replace("sp=", "sp=r&x=").split("&sig=")[0] + "&sig=bm9wZQ%3D%3D"
        done, _ = run_job(jobs, export_props(read_only))
        assert done.status == "failed" and done.failure_reason


def test_blob_names_with_any_character_through_azurite(hub, tmp_path, monkeypatch):
    """Issue 53: named blobs in SAS containers, with unicode and URL-reserved characters in the
    blob names and the device ids, are written and read under exactly those names."""
    jobs, registry = managers(hub, monkeypatch)
    odd_id = "exp:odd@x'(1)#%"
    hub.create_device(odd_id)
    with Azurite(tmp_path / "azurite") as blob:
        out_uri, out = azurite_container(blob, "named-exports")
        out_name = "exports/été #1?%41+ (x).txt"
        done, _ = run_job(jobs, JobProperties(type="export", output_blob_container_uri=out_uri,
                                              output_blob_name=out_name))
        assert done.status == "completed", done.failure_reason
        assert [b.name for b in out.list_blobs()] == [out_name]
        exported = read_lines(out.download_blob(out_name).readall().decode())
        line = next(l for l in exported if l["id"] == odd_id)
        in_uri, inp = azurite_container(blob, "named-imports")
        in_name = "entrées/日本 #2%.txt"
        copy = dict(line, id=odd_id + "-copy", importMode="create")
        inp.upload_blob(in_name, json.dumps(copy) + "\n")
        logs_uri, logs = azurite_container(blob, "named-logs")
        done, _ = run_job(jobs, JobProperties(type="import", input_blob_container_uri=in_uri,
                                              input_blob_name=in_name, output_blob_container_uri=logs_uri))
        assert done.status == "completed", done.failure_reason
        assert registry.get_device(odd_id + "-copy").device_id == odd_id + "-copy"


def test_bad_requests_are_refused(hub, tmp_path, monkeypatch):
    jobs, _ = managers(hub, monkeypatch)
    token = hub.token()
    for body, needle in [
        ({"type": "export"}, "outputBlobContainerUri"),
        ({"type": "import", "outputBlobContainerUri": file_uri(tmp_path)}, "inputBlobContainerUri"),
        ({"type": "backup", "outputBlobContainerUri": file_uri(tmp_path)}, "backup"),
        ({"type": "export", "outputBlobContainerUri": "https://acct.blob.core.windows.net/c"}, "SAS"),
        ({"type": "export", "outputBlobContainerUri": "ftp://x/y"}, "not supported"),
    ]:
        r = hub.request("POST", "/jobs/create", token, json=body)
        assert r.status_code == 400 and needle in r.text, (body, r.status_code, r.text)
    r = hub.request("POST", "/jobs/create", hub.token("registryRead"),
                    json={"type": "import", "inputBlobContainerUri": file_uri(tmp_path), "outputBlobContainerUri": file_uri(tmp_path)})
    assert r.status_code == 401
    assert hub.request("GET", "/jobs", hub.token("service")).status_code == 401


def big_import_file(path, n, prefix):
    return write_lines(path, ({"id": f"{prefix}{i:06d}", "tags": {"k": i}} for i in range(n)))


def test_cancel_and_one_job_at_a_time(hub, tmp_path, monkeypatch):
    jobs, _ = managers(hub, monkeypatch)
    big_import_file(tmp_path / "in" / "devices.txt", 100_000, "bulk-")
    created = jobs.create_import_export_job(import_props(file_uri(tmp_path / "in"), file_uri(tmp_path / "out")))
    with pytest.raises(HttpOperationError) as second:
        jobs.create_import_export_job(export_props(file_uri(tmp_path / "other")))
    assert second.value.response.status_code == 403
    assert "JobQuotaExceeded" in second.value.response.text
    jobs.cancel_import_export_job(created.job_id)
    done = wait_job(jobs.get_import_export_job, created.job_id)
    assert done.status == "cancelled"
    total = hub.request("GET", "/statistics/devices", hub.token()).json()["totalDeviceCount"]
    assert total < 100_000, "cancelled before the end"
    # Once it has stopped, a new job runs.
    done, _ = run_job(jobs, export_props(file_uri(tmp_path / "after")))
    assert done.status == "completed"
    assert len(read_lines((tmp_path / "after" / "devices.txt").read_text())) == total


def test_sigkill_during_an_import_leaves_whole_identities_and_a_failed_job(tmp_path):
    hub = Hub(tmp_path / "hub").start()
    try:
        n = 60_000
        big_import_file(tmp_path / "in" / "devices.txt", n, "k-")
        r = hub.request("POST", "/jobs/create", hub.token(), json={
            "type": "import", "inputBlobContainerUri": file_uri(tmp_path / "in"),
            "outputBlobContainerUri": file_uri(tmp_path / "out")})
        job_id = r.json()["jobId"]
        while True:
            total = hub.request("GET", "/statistics/devices", hub.token()).json()["totalDeviceCount"]
            if total >= 1000:
                break
        os.kill(hub.proc.pid, signal.SIGKILL)
        hub.proc.wait()
        hub.start()
        job = hub.request("GET", f"/jobs/{job_id}", hub.token()).json()
        assert job["status"] in ("failed", "completed"), job
        if job["status"] == "failed":
            assert "stopped while the job was running" in job["failureReason"], job
        # Every identity the file names is either absent or has the tags its line gave.
        r = hub.request("POST", "/jobs/create", hub.token(), json={
            "type": "export", "outputBlobContainerUri": file_uri(tmp_path / "check")})
        wait_job(lambda j: hub.request("GET", f"/jobs/{j}", hub.token()).json(), r.json()["jobId"])
        exported = read_lines((tmp_path / "check" / "devices.txt").read_text())
        assert 1000 <= len(exported) <= n
        for line in exported:
            assert line["tags"] == {"k": int(line["id"][2:])}, line["id"]
    finally:
        hub.kill()
