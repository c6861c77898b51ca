"""Storage container endpoints (issue 68, point 1; docs/routing.md, "Storage container
endpoints"): a custom endpoint with a `storageContainer` target has its routed messages written
in batches to blobs of an Azure Storage container, as IoT Hub's storage endpoints write them.

Azurite (the storage emulator, from npm) holds the containers; the blobs are read back with the
official storage SDK and a standard Avro reader (fastavro); a device sends with the official
Python SDK. Checked here:
- an `avro` endpoint writes Avro object container files with IoT Hub's schema
  (`Microsoft.Azure.Devices.Message`: EnqueuedTimeUtc, Properties, SystemProperties, Body), a
  `json` endpoint one JSON object per line (a JSON body as JSON, any other base64), each under
  its `fileNameFormat`;
- the batch rules: nothing is written before the batch's window (`batchFrequencyInSeconds`,
  60 at the least) has passed, then one blob per partition holds the window's messages, in
  the order sent;
- a target in the configuration file reads its connection string from a file;
- IoT Hub's limits are refused 400 naming the field (a file name format without a token, a
  batch frequency or chunk size out of range, an unknown encoding, a bad container name or
  connection string).

Against a cluster (FERROHUB_TEST_CLUSTER=1) the module runs again behind HAProxy: the writer
writes the blobs.
"""

import io
import json
import os
import re
import time

import fastavro
import pytest
from azure.iot.device import Message
from azure.storage.blob import BlobServiceClient

from azurite import Azurite
from deliverykit import device, drop_routing, put_route, wait_for

CLUSTER = os.environ.get("FERROHUB_TEST_CLUSTER") == "1"


def storage(blob: Azurite, container: str, **extra) -> dict:
    return {"connectionString": blob.connection_string, "containerName": container,
            "batchFrequencyInSeconds": 60, **extra}


def put_endpoint(hub, name: str, target: dict, partitions: int = 2) -> dict:
    r = hub.request("PUT", f"/routing/endpoints/{name}", hub.token(),
                    json={"partitionCount": partitions, "storageContainer": target})
    assert r.status_code == 201, r.text
    return r.json()


def blobs(blob: Azurite, container: str) -> dict[str, bytes]:
    client = BlobServiceClient.from_connection_string(blob.connection_string).get_container_client(container)
    return {b.name: client.download_blob(b.name).readall() for b in client.list_blobs()}


def send(client, n: int):
    for i in range(n):
        m = Message(json.dumps({"kind": "store", "n": i}))
        m.content_type, m.content_encoding = "application/json", "utf-8"
        m.custom_properties["kind"] = "store"
        client.send_message(m)
    raw = Message(b"\x00\x01\xfe")
    raw.content_type = "application/octet-stream"
    raw.custom_properties["kind"] = "store"
    client.send_message(raw)


def test_routed_messages_reach_avro_and_json_blobs_after_the_batch_window(sdk_hub, tmp_path):
    with Azurite(tmp_path / "azurite") as blob:
        blob.create_container("archive-avro")
        blob.create_container("archive-json")
        shown = put_endpoint(sdk_hub, "to-avro", storage(blob, "archive-avro", encoding="avro"))["storageContainer"]
        assert shown["fileNameFormat"] == "{iothub}/{partition}/{YYYY}/{MM}/{DD}/{HH}/{mm}"
        assert shown["encoding"] == "avro" and shown["maxChunkSizeInBytes"] == 314572800
        assert "connectionString" not in shown
        json_format = "json/{YYYY}-{MM}-{DD}/{HH}{mm}/{iothub}-{partition}.json"
        put_endpoint(sdk_hub, "to-json", storage(blob, "archive-json", encoding="JSON", fileNameFormat=json_format))
        put_route(sdk_hub, "to-storage", "kind = 'store'", ["to-avro", "to-json"])
        client = device(sdk_hub, "st-1")
        try:
            sent_at = time.time()
            send(client, 4)
            # The window is open: nothing is written yet.
            time.sleep(3)
            assert blobs(blob, "archive-avro") == {} and blobs(blob, "archive-json") == {}
            avro_blobs = wait_for(lambda: blobs(blob, "archive-avro"), lambda b: len(b) > 0, timeout=150, interval=1)
            assert time.time() - sent_at >= 55, "a batch was written before its window passed"
            json_blobs = wait_for(lambda: blobs(blob, "archive-json"), lambda b: len(b) > 0, timeout=30, interval=1)
        finally:
            client.shutdown()
            drop_routing(sdk_hub, ["to-storage"], ["to-avro", "to-json"])

    # Avro: IoT Hub's schema, one blob holds the device's window, in the order sent.
    holding = {}
    for name, data in avro_blobs.items():
        assert re.fullmatch(r"[^/]+/[01]/\d{4}/\d{2}/\d{2}/\d{2}/\d{2}(_\d+)?", name), name
        reader = fastavro.reader(io.BytesIO(data))
        assert reader.writer_schema["name"] == "Microsoft.Azure.Devices.Message"
        assert [f["name"] for f in reader.writer_schema["fields"]] == \
            ["EnqueuedTimeUtc", "Properties", "SystemProperties", "Body"]
        records = [r for r in reader if r["SystemProperties"].get("connectionDeviceId") == "st-1"]
        if records:
            holding[name] = records
    assert len(holding) == 1, list(holding)
    records = next(iter(holding.values()))
    assert [json.loads(r["Body"])["n"] for r in records[:4]] == [0, 1, 2, 3]
    assert records[4]["Body"] == b"\x00\x01\xfe"
    for r in records:
        assert r["Properties"]["kind"] == "store"
        assert r["SystemProperties"]["contentType"] in ("application/json", "application/octet-stream")
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{7}Z", r["EnqueuedTimeUtc"])

    # JSON: one object per line under the configured name; a JSON body as JSON, else base64.
    lines = []
    for name, data in json_blobs.items():
        assert re.fullmatch(r"json/\d{4}-\d{2}-\d{2}/\d{4}/[^/]+-[01](_\d+)?\.json", name), name
        lines += [json.loads(line) for line in data.decode().splitlines()]
    mine = [line for line in lines if line["SystemProperties"].get("connectionDeviceId") == "st-1"]
    assert [line["Body"] for line in mine[:4]] == [{"kind": "store", "n": i} for i in range(4)]
    assert mine[4]["Body"] == "AAH+"
    assert set(mine[0]) == {"EnqueuedTimeUtc", "Properties", "SystemProperties", "Body"}


@pytest.mark.parametrize("change, field", [
    ({"fileNameFormat": "{iothub}/{partition}/{YYYY}/{MM}/{DD}/{HH}"}, "fileNameFormat"),
    ({"batchFrequencyInSeconds": 59}, "batchFrequencyInSeconds"),
    ({"batchFrequencyInSeconds": 721}, "batchFrequencyInSeconds"),
    ({"maxChunkSizeInBytes": 1048576}, "maxChunkSizeInBytes"),
    ({"maxChunkSizeInBytes": 524288001}, "maxChunkSizeInBytes"),
    ({"encoding": "xml"}, "encoding"),
    ({"containerName": "Archive_1"}, "containerName"),
    ({"connectionString": "AccountName=devstoreaccount1"}, "connectionString"),
    ({"fileNameFormat": "{iothub}//{partition}/{YYYY}/{MM}/{DD}/{HH}/{mm}"}, "fileNameFormat"),
    ({"fileNameFormat": "../{iothub}/{partition}/{YYYY}/{MM}/{DD}/{HH}/{mm}"}, "fileNameFormat"),
])
def test_iot_hubs_limits_are_refused_with_the_field_named(sdk_hub, change, field):
    target = {"connectionString": "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=a2V5;"
                                  "BlobEndpoint=http://127.0.0.1:1/a",
              "containerName": "archive", **change}
    r = sdk_hub.request("PUT", "/routing/endpoints/bad-store", sdk_hub.token(),
                        json={"partitionCount": 1, "storageContainer": target})
    assert r.status_code == 400 and f"storageContainer.{field}" in r.text, (r.status_code, r.text)
    names = [e["name"] for e in sdk_hub.request("GET", "/routing", sdk_hub.token()).json()["endpoints"]]
    assert "bad-store" not in names


@pytest.mark.skipif(CLUSTER, reason="a hub of its own, started with a configuration file")
def test_a_storage_target_from_the_configuration_file_reads_its_connection_string_from_a_file(tmp_path):
    from hubkit import Hub

    (tmp_path / "storage.cs").write_text("DefaultEndpointsProtocol=http;AccountName=a;AccountKey=a2V5;"
                                         "BlobEndpoint=http://127.0.0.1:1/a\n")
    config = tmp_path / "hub.toml"
    config.write_text(f"""
[[routing.endpoints]]
name = "filed-store"
partitions = 1
[routing.endpoints.storage_container]
connection_string_file = "{tmp_path / 'storage.cs'}"
container_name = "filed"
batch_frequency = "2m"
encoding = "json"
""")
    hub = Hub(tmp_path / "hub").start(["--config", str(config)])
    try:
        shown = [e for e in hub.request("GET", "/routing", hub.token()).json()["endpoints"]
                 if e["name"] == "filed-store"][0]["storageContainer"]
        assert (shown["containerName"], shown["batchFrequencyInSeconds"], shown["encoding"]) == ("filed", 120, "json")
        assert shown["fileNameFormat"] == "{iothub}/{partition}/{YYYY}/{MM}/{DD}/{HH}/{mm}"
        assert "connectionString" not in shown
    finally:
        hub.stop()
    # A frequency out of IoT Hub's range stops the start, naming the field.
    config.write_text(config.read_text().replace('"2m"', '"30s"'))
    bad = Hub(tmp_path / "bad")
    with pytest.raises(Exception):
        bad.start(["--config", str(config)], timeout=20)
    assert "batchFrequencyInSeconds" in bad.log_tail(40)


def test_a_storage_target_beside_another_is_refused(sdk_hub):
    body = {"partitionCount": 1, "webhook": {"url": "https://127.0.0.1:1/"},
            "storageContainer": {"connectionString": "AccountName=a;AccountKey=a2V5", "containerName": "two"}}
    r = sdk_hub.request("PUT", "/routing/endpoints/two-targets", sdk_hub.token(), json=body)
    assert r.status_code == 400 and "one target" in r.text, (r.status_code, r.text)
