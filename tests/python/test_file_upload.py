"""FUP-1: file upload with the unmodified official device SDK (azure-iot-device
`get_storage_info_for_blob` / `notify_blob_upload_status`, which use port 443), an upload with
azure-storage-blob to Azurite using the SAS the hub granted, and the file-upload notification
received by the official Node service SDK (`getFileNotificationReceiver`, AMQP on 5671)."""

import json
import subprocess
from urllib.parse import quote, unquote

import pytest
from azure.core.exceptions import HttpResponseError
from azure.iot.device import IoTHubDeviceClient
from azure.storage.blob import BlobClient, BlobServiceClient

from azurite import Azurite
from hubkit import Hub
from test_node_sdk import SERVICE_JS, node_env

CONTAINER = "fileuploads"


@pytest.fixture(scope="module")
def upload_hub(tmp_path_factory):
    """Azurite, and a hub on the SDKs' fixed ports configured to grant uploads into it."""
    base = tmp_path_factory.mktemp("upload")
    with Azurite(base / "azurite") as blob:
        BlobServiceClient.from_connection_string(blob.connection_string).create_container(CONTAINER)
        config = base / "hub.toml"
        config.write_text(f'[file_upload]\nconnection_string = "{blob.connection_string}"\n'
                          f'container = "{CONTAINER}"\nsas_ttl = "10m"\nnotifications = true\n')
        h = Hub(base / "hub")
        h.https_addr, h.mqtt_addr, h.amqp_addr = "127.0.0.1:443", "127.0.0.1:8883", "127.0.0.1:5671"
        h.start(["--config", str(config)])
        h.blob = blob
        yield h
        h.stop()


def device_client(hub, device_id):
    return IoTHubDeviceClient.create_from_connection_string(
        hub.device_connection_string(device_id), server_verification_cert=open(hub.ca).read(),
        connection_retry=False)


def receive_notifications(hub, count, abandon_first=False, timeout_ms=30000):
    request = {"op": "fileNotifications", "count": count, "abandonFirst": abandon_first, "timeoutMs": timeout_ms,
               "connectionString": hub.connection_string("service", with_port=False)}
    done = subprocess.run(["node", SERVICE_JS], input=json.dumps(request), capture_output=True, text=True,
                          timeout=120, env=node_env(hub))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def upload_url(info, blob_name=None):
    return f"http://{info['hostName']}/{info['containerName']}/{blob_name or info['blobName']}{info['sasToken']}"


def test_upload_and_notification(upload_hub):
    hub = upload_hub
    hub.create_device("uploader")
    client = device_client(hub, "uploader")
    try:
        info = client.get_storage_info_for_blob("reports/day1.txt")
        assert info["containerName"] == CONTAINER
        assert info["blobName"] == "uploader/reports/day1.txt"
        assert info["hostName"] == f"{hub.blob.host}:{hub.blob.port}/devstoreaccount1"
        assert info["sasToken"].startswith("?") and "sig=" in info["sasToken"] and "sp=w" in info["sasToken"]
        payload = b"temperature,21.5\n" * 100
        BlobClient.from_blob_url(upload_url(info)).upload_blob(payload)
        # The SAS is for that one blob: another name, or reading, is refused by storage.
        with pytest.raises(HttpResponseError) as other:
            BlobClient.from_blob_url(upload_url(info, "uploader/other.txt")).upload_blob(b"x")
        assert other.value.status_code == 403
        with pytest.raises(HttpResponseError) as read:
            BlobClient.from_blob_url(upload_url(info)).download_blob().readall()
        assert read.value.status_code == 403
        client.notify_blob_upload_status(info["correlationId"], True, 200, "uploaded")
        # The same correlation id is not accepted twice.
        r = hub.request("POST", "/devices/uploader/files/notifications", hub.device_token("uploader"),
                        json={"correlationId": info["correlationId"], "isSuccess": True, "statusCode": 200,
                              "statusDescription": "again"})
        assert r.status_code == 400 and "correlation" in r.text
        # A failed upload is recorded but produces no notification.
        failed = client.get_storage_info_for_blob("reports/broken.txt")
        client.notify_blob_upload_status(failed["correlationId"], False, 500, "disk full")
    finally:
        client.shutdown()
    stored = BlobServiceClient.from_connection_string(hub.blob.connection_string) \
        .get_blob_client(CONTAINER, "uploader/reports/day1.txt").download_blob().readall()
    assert stored == payload

    got = receive_notifications(hub, 1, abandon_first=True)
    assert not got.get("timedOut"), got
    assert [n["settled"] for n in got["notifications"]] == ["abandon", "complete"], "abandoned comes back"
    n = got["notifications"][-1]["notification"]
    assert n["deviceId"] == "uploader" and n["blobName"] == "uploader/reports/day1.txt"
    assert n["blobSizeInBytes"] == len(payload)
    assert n["blobUri"] == f"http://{hub.blob.host}:{hub.blob.port}/devstoreaccount1/{CONTAINER}/uploader/reports/day1.txt"
    assert n["enqueuedTimeUtc"] and n["lastUpdatedTime"]
    # Completed: it is not delivered again, and the failed upload never was.
    again = receive_notifications(hub, 1, timeout_ms=1500)
    assert again.get("timedOut") and again["notifications"] == []


def test_upload_requests_are_checked(upload_hub):
    hub = upload_hub
    hub.create_device("uploader-2")
    hub.create_device("someone-else")
    token = hub.device_token("uploader-2")
    r = hub.request("POST", "/devices/someone-else/files", token, json={"blobName": "x.txt"})
    assert r.status_code == 401, "a device asks only for itself"
    for name in ["", "../escape.txt", "a//b"]:
        r = hub.request("POST", "/devices/uploader-2/files", token, json={"blobName": name})
        assert r.status_code == 400, (name, r.text)
    r = hub.request("POST", "/devices/uploader-2/files/notifications", token,
                    json={"correlationId": "never-issued", "isSuccess": True, "statusCode": 200, "statusDescription": ""})
    assert r.status_code == 400 and "never-issued" in r.text
    # A correlation id issued to one device is not accepted from another.
    info = hub.request("POST", "/devices/uploader-2/files", token, json={"blobName": "y.txt"}).json()
    r = hub.request("POST", "/devices/someone-else/files/notifications", hub.device_token("someone-else"),
                    json={"correlationId": info["correlationId"], "isSuccess": True, "statusCode": 200, "statusDescription": ""})
    assert r.status_code == 400
    # Reported successful, but nothing was uploaded: refused, nothing queued.
    r = hub.request("POST", "/devices/uploader-2/files/notifications", token,
                    json={"correlationId": info["correlationId"], "isSuccess": True, "statusCode": 200, "statusDescription": ""})
    assert r.status_code == 400 and "cannot be read" in r.text


def test_a_hub_without_a_storage_account_refuses_uploads(hub):
    hub.create_device("no-storage")
    r = hub.request("POST", "/devices/no-storage/files", hub.device_token("no-storage"), json={"blobName": "a.txt"})
    assert r.status_code == 400 and "not configured" in r.text
    assert r.json()["errorCode"] == 400004


# One name per character class a blob name may hold (issue 53): unicode, spaces, and the
# characters URLs reserve or escape. Each is uploaded and must land under exactly its name.
SPECIAL_NAMES = [
    "logs/2026/été-1.bin", "日本/データ.bin", "with space.txt", "hash#1.txt", "pct%41.txt",
    "ask?x=1.txt", "plus+1.txt", "it's.txt", "at@home.txt", "(paren).txt", "co:lon.txt",
]


def encoded_upload_url(info, blob_name=None):
    """The blob's URL as the C# and Java device SDKs build it: the name percent-encoded."""
    return (f"http://{info['hostName']}/{info['containerName']}/"
            f"{quote(blob_name or info['blobName'], safe='/')}{info['sasToken']}")


def test_blob_names_with_any_character_upload_to_exactly_that_blob(upload_hub):
    hub = upload_hub
    device_id = "up:loader@x'(1)"
    hub.create_device(device_id)
    client = device_client(hub, device_id)
    uploaded = {}
    try:
        for i, name in enumerate(SPECIAL_NAMES):
            info = client.get_storage_info_for_blob(name)
            full = f"{device_id}/{name}"
            assert info["blobName"] == full, "the name comes back as stored, not encoded"
            payload = f"{i}:{name}\n".encode() * (i + 1)
            BlobClient.from_blob_url(encoded_upload_url(info)).upload_blob(payload)
            uploaded[full] = payload
            client.notify_blob_upload_status(info["correlationId"], True, 200, "uploaded")
        # The Python samples concatenate the name unencoded: that reaches the same blob for
        # every name without a character a URL reserves ('#', '?', '%').
        info = client.get_storage_info_for_blob("logs/2026/été-1.bin")
        BlobClient.from_blob_url(upload_url(info)).upload_blob(b"raw", overwrite=True)
        uploaded[info["blobName"]] = b"raw"
        client.notify_blob_upload_status(info["correlationId"], True, 200, "uploaded")

        # A grant is for its blob only: not for a name that differs by its encoding, nor for
        # any other name.
        info = client.get_storage_info_for_blob("pct%41.txt")
        for other in [f"{device_id}/pctA.txt", f"{device_id}/pct%2541.txt", f"{device_id}/other.txt"]:
            with pytest.raises(HttpResponseError) as refused:
                BlobClient.from_blob_url(encoded_upload_url(info, other)).upload_blob(b"x")
            assert refused.value.status_code == 403, other
    finally:
        client.shutdown()

    service = BlobServiceClient.from_connection_string(hub.blob.connection_string)
    container = service.get_container_client(CONTAINER)
    stored = {b.name for b in container.list_blobs(name_starts_with=device_id)}
    assert stored == set(uploaded), "every upload landed under its own name, and nothing else"
    for name, payload in uploaded.items():
        assert container.get_blob_client(name).download_blob().readall() == payload, name

    got = receive_notifications(hub, len(SPECIAL_NAMES) + 1)
    assert not got.get("timedOut"), got
    notes = [n["notification"] for n in got["notifications"]]
    seen = {}
    for n in notes:
        assert n["deviceId"] == device_id
        seen[n["blobName"]] = n
    assert set(seen) == set(uploaded)
    for name, n in seen.items():
        # The raw-URL upload overwrote the first one: its notification may show either size.
        if name != f"{device_id}/logs/2026/été-1.bin":
            assert n["blobSizeInBytes"] == len(uploaded[name]), name
        prefix = f"http://{hub.blob.host}:{hub.blob.port}/devstoreaccount1/{CONTAINER}/"
        assert n["blobUri"] == prefix + quote(name, safe="/-._~"), "the URI is the name percent-encoded"
        assert unquote(n["blobUri"][len(prefix):]) == name
