"""Scheduled jobs (issue 15, part 3) through the official service SDK (`IoTHubJobManager`) and
device SDK: a twin job reaches exactly the devices its condition selects (and a connected one
sees the desired patch); a method job calls connected devices, calls one that comes online
during the job, and fails one that never does the way IoT Hub reports it; per-device rows in
`SELECT * FROM devices.jobs`; cancel stops a running job; a job in progress survives SIGKILL
and resumes where it was."""

import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from azure.iot.device import IoTHubDeviceClient, MethodResponse
from azure.iot.hub import IoTHubJobManager, IoTHubRegistryManager
from azure.iot.hub.models import CloudToDeviceMethod, JobRequest, QuerySpecification, Twin, TwinProperties
from msrest.exceptions import HttpOperationError

from hubkit import Hub
from jobkit import import_devices


@pytest.fixture
def managers(sdk_hub, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", sdk_hub.ca)
    cs = sdk_hub.connection_string("iothubowner", with_port=False)
    return IoTHubJobManager.from_connection_string(cs), IoTHubRegistryManager.from_connection_string(cs)


def job_id(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_status(jobs, jid, wanted=("completed", "failed", "cancelled"), timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = jobs.get_scheduled_job(jid)
        if job.status in wanted:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {jid} still {job.status}")


def query_all(registry, text):
    items, token = [], None
    while True:
        result = registry.query_iot_hub(QuerySpecification(query=text), token, 100)
        items.extend(result.items)
        token = result.continuation_token
        if not token:
            return items, result.type


def job_rows(registry, jid):
    items, kind = query_all(registry, f"SELECT * FROM devices.jobs WHERE devices.jobs.jobId = '{jid}'")
    assert kind == "deviceJob"
    return {i.device_id: i.additional_properties | {"status": i.status} for i in items}


def device_client(hub, device_id):
    return IoTHubDeviceClient.create_from_connection_string(
        hub.device_connection_string(device_id), server_verification_cert=open(hub.ca).read())


def test_twin_job_reaches_exactly_the_matching_devices(sdk_hub, managers):
    jobs, registry = managers
    fleet = [f"tj-{i:02d}" for i in range(24)]
    for i, d in enumerate(fleet):
        sdk_hub.create_device(d)
        sdk_hub.set_tags(d, {"x": "y" if i % 3 == 0 else "z", "i": i})
    matching = sorted(d for i, d in enumerate(fleet) if i % 3 == 0)
    patches = []
    client = device_client(sdk_hub, "tj-00")
    client.connect()
    client.on_twin_desired_properties_patch_received = patches.append
    try:
        jid = job_id("twin")
        request = JobRequest(job_id=jid, type="scheduleUpdateTwin", query_condition="tags.x = 'y'",
                             update_twin=Twin(etag="*", tags={"done": "yes"},
                                              properties=TwinProperties(desired={"mode": "eco"})),
                             start_time=datetime.utcnow(), max_execution_time_in_seconds=60)
        created = jobs.create_scheduled_job(jid, request)
        assert created.job_id == jid and created.type == "scheduleUpdateTwin"
        assert created.status in ("queued", "running", "completed")
        job = wait_status(jobs, jid)
        assert job.status == "completed", job
        stats = job.device_job_statistics
        assert (stats.device_count, stats.succeeded_count, stats.failed_count) == (len(matching), len(matching), 0)
        assert job.end_time is not None
        done = sorted(t.device_id for t in query_all(registry, "SELECT * FROM devices WHERE tags.done = 'yes'")[0])
        assert done == matching
        eco = sorted(t.device_id for t in query_all(registry, "SELECT * FROM devices WHERE properties.desired.mode = 'eco'")[0])
        assert eco == matching
        deadline = time.time() + 10
        while not patches and time.time() < deadline:
            time.sleep(0.05)
        assert patches and patches[0]["mode"] == "eco", patches
        rows = job_rows(registry, jid)
        assert sorted(rows) == matching
        assert all(r["status"] == "completed" and r["jobType"] == "scheduleUpdateTwin" for r in rows.values()), rows
        listed = jobs.query_scheduled_jobs("scheduleUpdateTwin", "completed")
        # QueryResult items stay plain JSON objects in the Python SDK.
        assert jid in [j["jobId"] for j in listed.items] and listed.type == "jobResponse"
        assert all(j["status"] == "completed" for j in listed.items)
        assert jid not in [j["jobId"] for j in jobs.query_scheduled_jobs("scheduleDeviceMethod", None).items]
    finally:
        client.shutdown()


def answering(hub, device_id, calls):
    client = device_client(hub, device_id)

    def handler(request):
        calls.append((device_id, request.name, request.payload))
        client.send_method_response(MethodResponse.create_from_method_request(request, 200, {"me": device_id}))

    client.connect()
    client.on_method_request_received = handler
    return client


def test_method_job_calls_online_devices_and_fails_offline_ones(sdk_hub, managers):
    jobs, registry = managers
    online, late, offline = ["mj-on-1", "mj-on-2", "mj-on-3"], "mj-late", "mj-off"
    for d in online + [late, offline, "mj-other"]:
        sdk_hub.create_device(d)
        sdk_hub.set_tags(d, {"grp": "other" if d == "mj-other" else "m"})
    calls = []
    clients = [answering(sdk_hub, d, calls) for d in online]
    try:
        jid = job_id("method")
        jobs.create_scheduled_job(jid, JobRequest(
            job_id=jid, type="scheduleDeviceMethod", query_condition="tags.grp = 'm'",
            cloud_to_device_method=CloudToDeviceMethod(method_name="reboot", payload={"delay": 1},
                                                        response_timeout_in_seconds=10),
            start_time=datetime.utcnow(), max_execution_time_in_seconds=20))
        # The late device comes online while the job runs (it waits for offline devices until
        # its end, 20 s: room for a slow machine's SDK connect) and is called then.
        deadline = time.time() + 10
        while len(calls) < len(online):
            assert time.time() < deadline, calls
            time.sleep(0.05)
        clients.append(answering(sdk_hub, late, calls))
        assert jobs.get_scheduled_job(jid).status == "running", "the job ended before the late device came"
        job = wait_status(jobs, jid, timeout=60)
        assert job.status == "completed", job
        stats = job.device_job_statistics
        assert (stats.device_count, stats.succeeded_count, stats.failed_count, stats.pending_count) == (5, 4, 1, 0)
        assert sorted(c[0] for c in calls) == sorted(online + [late])
        assert all(c[1] == "reboot" and c[2] == {"delay": 1} for c in calls)
        rows = job_rows(registry, jid)
        assert sorted(rows) == sorted(online + [late, offline])
        for d in online + [late]:
            assert rows[d]["status"] == "completed"
            assert rows[d]["outcome"] == {"deviceMethodResponse": {"status": 200, "payload": {"me": d}}}
        assert rows[offline]["status"] == "failed"
        assert rows[offline]["error"]["code"] == "JobRunPreconditionFailed"
    finally:
        for c in clients:
            c.shutdown()


def test_cancel_stops_a_running_job(sdk_hub, managers):
    jobs, registry = managers
    for d in ["cj-1", "cj-2"]:
        sdk_hub.create_device(d)
        sdk_hub.set_tags(d, {"grp": "cancel"})
    jid = job_id("cancel")
    jobs.create_scheduled_job(jid, JobRequest(
        job_id=jid, type="scheduleDeviceMethod", query_condition="tags.grp = 'cancel'",
        cloud_to_device_method=CloudToDeviceMethod(method_name="m", response_timeout_in_seconds=5),
        start_time=datetime.utcnow(), max_execution_time_in_seconds=600))
    deadline = time.time() + 30
    while jobs.get_scheduled_job(jid).device_job_statistics.pending_count != 2:
        assert time.time() < deadline
        time.sleep(0.1)
    cancelled = jobs.cancel_scheduled_job(jid)
    assert cancelled.status == "cancelled" and cancelled.end_time is not None
    # A device coming online after the cancel is not called.
    calls = []
    client = answering(sdk_hub, "cj-1", calls)
    try:
        time.sleep(1.5)
        assert calls == []
        job = jobs.get_scheduled_job(jid)
        assert job.status == "cancelled" and job.device_job_statistics.succeeded_count == 0
        assert {r["status"] for r in job_rows(registry, jid).values()} == {"canceled"}
    finally:
        client.shutdown()
    # A job scheduled for later is cancelled before it starts, and a cancel of a finished job
    # changes nothing.
    later = job_id("later")
    created = jobs.create_scheduled_job(later, JobRequest(
        job_id=later, type="scheduleUpdateTwin", query_condition="*", update_twin=Twin(tags={"never": 1}),
        start_time=datetime.utcnow() + timedelta(hours=1), max_execution_time_in_seconds=60))
    assert created.status == "scheduled"
    assert jobs.cancel_scheduled_job(later).status == "cancelled"
    assert jobs.cancel_scheduled_job(later).status == "cancelled"
    assert query_all(registry, "SELECT * FROM devices WHERE tags.never = 1")[0] == []


def error_of(excinfo):
    return excinfo.value.response.status_code, excinfo.value.response.json()


def test_bad_requests_are_refused_before_a_job_exists(sdk_hub, managers):
    jobs, _ = managers
    bad = job_id("bad")
    with pytest.raises(HttpOperationError) as e:
        jobs.create_scheduled_job(bad, JobRequest(job_id=bad, type="scheduleUpdateTwin", query_condition="tags.x = = 1",
                                                  update_twin=Twin(tags={"a": 1})))
    status, body = error_of(e)
    assert status == 400 and body["errorCode"] == 400004
    assert "SQL query parse failed due to following errors: Line 1:38" in body["Message"]
    with pytest.raises(HttpOperationError) as e:
        jobs.create_scheduled_job(bad, JobRequest(job_id=bad, type="scheduleDeviceMethod", query_condition="*"))
    assert error_of(e)[0] == 400
    with pytest.raises(HttpOperationError) as e:
        jobs.get_scheduled_job(bad)
    assert error_of(e)[0] == 404 and error_of(e)[1]["errorCode"] == 404002
    ok = job_id("dup")
    request = JobRequest(job_id=ok, type="scheduleUpdateTwin", query_condition="tags.nobody = 1", update_twin=Twin(tags={"a": 1}))
    jobs.create_scheduled_job(ok, request)
    with pytest.raises(HttpOperationError) as e:
        jobs.create_scheduled_job(ok, request)
    assert error_of(e)[0] == 409


N_KILL = 20_000


def test_a_twin_job_survives_sigkill_and_resumes(tmp_path, monkeypatch):
    """20,000 devices; the hub is killed while the job runs and the restarted hub finishes it:
    every twin patched exactly once (desired $version 2), one row per device."""
    hub = Hub(tmp_path / "hub")
    hub.start()
    try:
        import_devices(hub, tmp_path, ({"id": f"k{i:05d}", "tags": {"x": "y"}} for i in range(N_KILL)))
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", hub.ca)
        jobs = IoTHubJobManager.from_connection_string(hub.connection_string("iothubowner"))
        jid = "resume-me"
        jobs.create_scheduled_job(jid, JobRequest(
            job_id=jid, type="scheduleUpdateTwin", query_condition="tags.x = 'y'",
            update_twin=Twin(properties=TwinProperties(desired={"patched": True})),
            start_time=datetime.now(timezone.utc), max_execution_time_in_seconds=3600))
        while True:
            job = jobs.get_scheduled_job(jid)
            if job.device_job_statistics.device_count > 0:
                break
            time.sleep(0.02)
        hub.kill()
        assert job.status == "running" and job.device_job_statistics.device_count < N_KILL, job
        hub.start()
        jobs = IoTHubJobManager.from_connection_string(hub.connection_string("iothubowner"))
        job = wait_status(jobs, jid, timeout=300)
        assert job.status == "completed", job
        assert job.device_job_statistics.device_count == N_KILL == job.device_job_statistics.succeeded_count
        registry = IoTHubRegistryManager.from_connection_string(hub.connection_string("iothubowner"))
        counted = registry.query_iot_hub(QuerySpecification(
            query="SELECT COUNT() AS n FROM devices WHERE properties.desired.patched = true AND properties.desired.$version = 2"))
        assert counted.items[0].additional_properties["n"] == N_KILL
        rows = registry.query_iot_hub(QuerySpecification(
            query=f"SELECT COUNT() AS n FROM devices.jobs WHERE jobId = '{jid}' AND status = 'completed'"))
        assert rows.items[0].additional_properties["n"] == N_KILL
    finally:
        hub.kill()
