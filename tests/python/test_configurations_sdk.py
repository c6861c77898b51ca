"""Automatic device configurations (issue 15, part 4) through the official service SDK
(`IoTHubConfigurationManager`) and device SDK: desired properties applied to the devices a
target condition selects (seen by the device SDK as desired-property patches), a device tagged
later picks them up, priorities resolve conflicts and a deleted configuration gives way,
system and custom metrics count targeted and applied twins, etags guard updates, content is
immutable, and testQueries reports errors in its body."""

import threading
import time

import pytest
from azure.iot.device import IoTHubDeviceClient
from azure.iot.hub import IoTHubConfigurationManager, IoTHubRegistryManager
from azure.iot.hub.models import (Configuration, ConfigurationContent, ConfigurationMetrics,
                                  ConfigurationQueriesTestInput, QuerySpecification)
from msrest.exceptions import HttpOperationError

DEVICES = [f"cfg-{i}" for i in range(1, 7)]


@pytest.fixture
def managers(sdk_hub, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", sdk_hub.ca)
    cs = sdk_hub.connection_string("iothubowner", with_port=False)
    return IoTHubConfigurationManager.from_connection_string(cs), IoTHubRegistryManager.from_connection_string(cs)


def desired(hub, device_id):
    r = hub.request("GET", f"/twins/{device_id}", hub.token())
    assert r.status_code == 200, r.text
    return r.json()["properties"]["desired"], r.json().get("configurations", {})


def eventually(check, timeout=15):
    deadline = time.time() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


def ids_where(registry, where):
    items = registry.query_iot_hub(QuerySpecification(query=f"SELECT * FROM devices WHERE {where}"), None, 1000).items
    return sorted(t.device_id for t in items)


def test_configurations_apply_follow_tags_and_resolve_priorities(sdk_hub, managers):
    configs, registry = managers
    for i, d in enumerate(DEVICES, start=1):
        sdk_hub.create_device(d)
        sdk_hub.set_tags(d, {"env": "test" if i <= 4 else "prod"})
    patches = []
    got_patch = threading.Event()

    def on_patch(patch):
        patches.append(patch)
        got_patch.set()

    client = IoTHubDeviceClient.create_from_connection_string(
        sdk_hub.device_connection_string("cfg-1"), server_verification_cert=open(sdk_hub.ca).read())
    client.connect()
    client.on_twin_desired_properties_patch_received = on_patch
    try:
        client.patch_twin_reported_properties({"status": "pending"})
        low = configs.create_configuration(Configuration(
            id="c-low", priority=1, labels={"team": "cooling"}, target_condition="tags.env='test'",
            content=ConfigurationContent(device_content={"properties.desired.chiller": {"temp": 66}}),
            metrics=ConfigurationMetrics(queries={
                "pending": "SELECT deviceId FROM devices WHERE properties.reported.status = 'pending'"})))
        assert low.id == "c-low" and low.etag

        test_devices = DEVICES[:4]
        eventually(lambda: assert_equal(ids_where(registry, "properties.desired.chiller.temp = 66"), test_devices))
        assert got_patch.wait(10), "the device SDK saw no desired patch"
        assert patches[0]["chiller"] == {"temp": 66}
        assert ids_where(registry, "configurations.[[c-low]].status = 'Applied'") == test_devices
        untargeted = desired(sdk_hub, "cfg-6")
        assert "chiller" not in untargeted[0] and untargeted[1] == {}, untargeted

        got = configs.get_configuration("c-low")
        assert got.system_metrics.results == {"targetedCount": 4, "appliedCount": 4}
        assert got.metrics.results == {"pending": 1}
        assert "configurations.[[c-low]].status = 'Applied'" in got.system_metrics.queries["appliedCount"]
        assert got.labels == {"team": "cooling"} and got.content.device_content == {"properties.desired.chiller": {"temp": 66}}

        # A device that starts matching later picks it up.
        sdk_hub.set_tags("cfg-5", {"env": "test"})
        eventually(lambda: assert_equal(desired(sdk_hub, "cfg-5")[0].get("chiller"), {"temp": 66}))

        # A higher priority wins where both target; the lower one is only targeted there.
        configs.create_configuration(Configuration(
            id="c-high", priority=10, target_condition="tags.env='test' AND tags.zone='a'",
            content=ConfigurationContent(device_content={"properties.desired.chiller.temp": 70})))
        sdk_hub.set_tags("cfg-2", {"zone": "a"})
        eventually(lambda: assert_equal(desired(sdk_hub, "cfg-2")[0]["chiller"], {"temp": 70}))
        assert desired(sdk_hub, "cfg-2")[1] == {"c-high": {"status": "Applied"}, "c-low": {"status": "Targeted"}}
        assert desired(sdk_hub, "cfg-3")[0]["chiller"] == {"temp": 66}
        eventually(lambda: assert_equal(configs.get_configuration("c-low").system_metrics.results,
                                        {"targetedCount": 5, "appliedCount": 4}))

        # Deleting the winner gives the path back.
        configs.delete_configuration("c-high")
        eventually(lambda: assert_equal(desired(sdk_hub, "cfg-2")[0]["chiller"], {"temp": 66}))
        assert desired(sdk_hub, "cfg-2")[1] == {"c-low": {"status": "Applied"}}

        # Updates: the etag guards them and content cannot change.
        current = configs.get_configuration("c-low")
        with pytest.raises(HttpOperationError) as e:
            configs.update_configuration(Configuration(id="c-low", priority=2, target_condition="tags.env='test'",
                                                       content=current.content), "bm90IHRoaXM=")
        assert e.value.response.status_code == 412
        with pytest.raises(HttpOperationError) as e:
            configs.update_configuration(Configuration(id="c-low", priority=2, target_condition="tags.env='test'",
                                                       content=ConfigurationContent(device_content={"properties.desired.other": 1})),
                                         current.etag)
        assert e.value.response.status_code == 400
        updated = configs.update_configuration(Configuration(
            id="c-low", priority=2, target_condition="tags.env='test' AND deviceId != 'cfg-3'",
            content=current.content), current.etag)
        assert updated.priority == 2 and updated.etag != current.etag
        # cfg-3 is no longer targeted: what the configuration set is removed.
        eventually(lambda: assert_equal(("chiller" in desired(sdk_hub, "cfg-3")[0], desired(sdk_hub, "cfg-3")[1]), (False, {})))
        with pytest.raises(HttpOperationError) as e:
            configs.create_configuration(Configuration(id="c-low", content=current.content, target_condition="*"))
        assert e.value.response.status_code == 409

        assert [c.id for c in configs.get_configurations()] == ["c-low"]
        configs.delete_configuration("c-low")
        eventually(lambda: assert_equal(ids_where(registry, "IS_DEFINED(properties.desired.chiller)"), []))
        with pytest.raises(HttpOperationError) as e:
            configs.get_configuration("c-low")
        assert e.value.response.status_code == 404

        # A device created later is targeted too.
        configs.create_configuration(Configuration(
            id="c-star", target_condition="*",
            content=ConfigurationContent(device_content={"properties.desired": {"fleet": "yes"}})))
        eventually(lambda: assert_equal(desired(sdk_hub, "cfg-6")[0].get("fleet"), "yes"))
        sdk_hub.create_device("cfg-new")
        eventually(lambda: assert_equal((desired(sdk_hub, "cfg-new")[0].get("fleet"), desired(sdk_hub, "cfg-new")[1]),
                                        ("yes", {"c-star": {"status": "Applied"}})))
        configs.delete_configuration("c-star")

        # Module twins, through moduleContent and a FROM devices.modules target.
        sdk_hub.create_module("cfg-1", "edge")
        sdk_hub.create_module("cfg-1", "plain")
        r = sdk_hub.request("PATCH", "/twins/cfg-1/modules/edge", sdk_hub.token(), json={"tags": {"role": "edge"}})
        assert r.status_code == 200, r.text
        configs.create_configuration(Configuration(
            id="c-mod", target_condition="FROM devices.modules WHERE tags.role = 'edge'",
            content=ConfigurationContent(module_content={"properties.desired.mode": "m"})))

        def module_desired(m):
            return sdk_hub.request("GET", f"/twins/cfg-1/modules/{m}", sdk_hub.token()).json()["properties"]["desired"]

        eventually(lambda: assert_equal(module_desired("edge").get("mode"), "m"))
        assert "mode" not in module_desired("plain") and "mode" not in desired(sdk_hub, "cfg-1")[0]
        assert configs.get_configuration("c-mod").system_metrics.results == {"targetedCount": 1, "appliedCount": 1}
    finally:
        client.shutdown()


def assert_equal(a, b):
    assert a == b, (a, b)
    return a


def test_bad_configurations_are_refused_and_test_queries_answers_200(managers):
    configs, _ = managers
    out = configs.test_configuration_queries(ConfigurationQueriesTestInput(
        target_condition="tags.x = = 1", custom_metric_queries={"ok": "SELECT deviceId FROM devices", "bad": "SELECT FROM"}))
    assert out.target_condition_error.startswith("at 37:"), out.target_condition_error
    assert out.custom_metric_query_errors["ok"] == "" and out.custom_metric_query_errors["bad"]
    for bad in [
        Configuration(id="b1", target_condition="tags.x = = 1", content=ConfigurationContent(device_content={"properties.desired.a": 1})),
        Configuration(id="b2", target_condition="*", content=ConfigurationContent(device_content={"tags.a": 1})),
        Configuration(id="b3", target_condition="*", content=ConfigurationContent(module_content={"properties.desired.a": 1})),
        Configuration(id="b4", target_condition="*", content=ConfigurationContent(device_content={"properties.desired.a": 1}),
                      metrics=ConfigurationMetrics(queries={"m": "SELECT"})),
    ]:
        with pytest.raises(HttpOperationError) as e:
            configs.create_configuration(bad)
        assert e.value.response.status_code == 400, bad.id
        assert e.value.response.json()["errorCode"] == 400004
