"""Scheduled jobs and automatic device configurations through the unmodified official Node
service SDK (tests/node/fleet.js on port 443, the fixed-port hub): `JobClient.scheduleTwinUpdate`,
`getJob` and `createQuery` paged one job at a time (the array body and continuation header the
Node SDK reads); `Registry.addConfiguration`, `getConfiguration`, a forced
`updateConfiguration` and `removeConfiguration`."""

import json
import subprocess

from hubkit import REPO
from test_node_sdk import node_env

SCRIPT = str(REPO / "tests" / "node" / "fleet.js")


def fleet(hub, request, timeout=120):
    request = dict(request, connectionString=hub.connection_string("iothubowner", with_port=False))
    done = subprocess.run(["node", SCRIPT], input=json.dumps(request), capture_output=True, text=True,
                          timeout=timeout, env=node_env(hub))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_node_twin_jobs_and_their_listing(sdk_hub):
    for i in range(6):
        sdk_hub.create_device(f"nj-{i}")
        sdk_hub.set_tags(f"nj-{i}", {"node": "yes" if i < 4 else "no"})
    first = fleet(sdk_hub, {"op": "twinJob", "jobId": "node-job-1", "condition": "tags.node = 'yes'",
                            "patch": {"etag": "*", "tags": {"touched": 1}}})
    assert first["created"]["jobId"] == "node-job-1" and first["created"]["type"] == "scheduleUpdateTwin"
    assert first["job"]["status"] == "completed", first["job"]
    assert first["job"]["deviceJobStatistics"]["succeededCount"] == 4
    second = fleet(sdk_hub, {"op": "twinJob", "jobId": "node-job-2", "condition": "*",
                             "patch": {"properties": {"desired": {"node": True}}}})
    assert second["job"]["deviceJobStatistics"]["deviceCount"] == 6
    assert second["listed"] == ["node-job-1", "node-job-2"] and second["pages"] == 2
    touched = [i for i in range(6) if sdk_hub.request("GET", f"/twins/nj-{i}", sdk_hub.token()).json()["tags"].get("touched") == 1]
    assert touched == [0, 1, 2, 3]


def test_node_configurations_add_get_update_remove(sdk_hub):
    sdk_hub.create_device("nc-1")
    sdk_hub.set_tags("nc-1", {"ring": "canary"})
    result = fleet(sdk_hub, {"op": "configuration", "configuration": {
        "id": "node-cfg", "priority": 3, "targetCondition": "tags.ring = 'canary'", "labels": {"by": "node"},
        "content": {"deviceContent": {"properties.desired.ring": "canary"}}}})
    assert result["added"]["id"] == "node-cfg" and result["added"]["schemaVersion"] == "1.0"
    assert result["got"]["systemMetrics"]["results"]["targetedCount"] == 1
    assert result["updated"]["priority"] == 4 and result["updated"]["etag"] != result["added"]["etag"]
    assert result["removed"] == 204
    assert sdk_hub.request("GET", "/configurations/node-cfg", sdk_hub.token()).status_code == 404
