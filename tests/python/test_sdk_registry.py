"""REG-1..REG-5 through the unmodified official service SDK (azure-iot-hub 2.7.0)."""

import pytest
from azure.iot.hub import IoTHubRegistryManager
from azure.iot.hub.models import AuthenticationMechanism, ExportImportDevice, SymmetricKey
from msrest.exceptions import HttpOperationError

KEY_A = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
KEY_B = "HxwdHhsaGRgXFhUUExIREA8ODQwLCgkIBwYFBAMCAQA="


@pytest.fixture
def registry(hub, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", hub.ca)
    mgr = IoTHubRegistryManager.from_connection_string(hub.connection_string("iothubowner"))
    mgr.protocol.config.connection.verify = hub.ca
    return mgr


def status_of(excinfo):
    return excinfo.value.response.status_code


def test_devices(registry):
    created = registry.create_device_with_sas("sdk-dev", KEY_A, KEY_B, "enabled")
    assert created.device_id == "sdk-dev"
    assert created.authentication.type == "sas"
    assert created.authentication.symmetric_key.primary_key == KEY_A
    assert created.authentication.symmetric_key.secondary_key == KEY_B
    assert created.generation_id and created.etag
    assert created.connection_state == "Disconnected"

    generated = registry.create_device_with_sas("sdk-gen", None, None, "enabled")
    keys = generated.authentication.symmetric_key
    assert keys.primary_key and keys.secondary_key and keys.primary_key != keys.secondary_key

    got = registry.get_device("sdk-dev")
    assert got.etag == created.etag and got.generation_id == created.generation_id

    updated = registry.update_device_with_sas("sdk-dev", created.etag, KEY_A, KEY_B, "disabled",
                                              status_reason="maintenance window")
    assert updated.status == "disabled" and updated.status_reason == "maintenance window"
    assert updated.etag != created.etag
    assert registry.get_device("sdk-dev").status == "disabled"

    listed = registry.get_devices()
    assert sorted(d.device_id for d in listed) == ["sdk-dev", "sdk-gen"]
    assert len(registry.get_devices(1)) == 1

    stats = registry.get_device_registry_statistics()
    assert (stats.total_device_count, stats.enabled_device_count, stats.disabled_device_count) == (2, 1, 1)

    with pytest.raises(HttpOperationError) as stale:
        registry.delete_device("sdk-dev", etag=created.etag)
    assert status_of(stale) == 412
    assert registry.get_device("sdk-dev").etag == updated.etag
    registry.delete_device("sdk-dev", etag=updated.etag)
    registry.delete_device("sdk-gen")

    with pytest.raises(HttpOperationError) as missing:
        registry.get_device("sdk-dev")
    assert status_of(missing) == 404
    assert registry.get_devices() == []


def test_modules(registry):
    registry.create_device_with_sas("mod-host", None, None, "enabled")
    m = registry.create_module_with_sas("mod-host", "mod-1", "me", KEY_A, KEY_B)
    assert (m.device_id, m.module_id, m.managed_by) == ("mod-host", "mod-1", "me")
    registry.create_module_with_sas("mod-host", "mod-2", None, None, None)
    got = registry.get_module("mod-host", "mod-1")
    assert got.etag == m.etag and got.authentication.symmetric_key.primary_key == KEY_A

    updated = registry.update_module_with_sas("mod-host", "mod-1", "someone-else", m.etag, KEY_B, KEY_A)
    assert updated.managed_by == "someone-else"
    assert updated.authentication.symmetric_key.primary_key == KEY_B
    assert updated.etag != m.etag

    assert sorted(x.module_id for x in registry.get_modules("mod-host")) == ["mod-1", "mod-2"]
    with pytest.raises(HttpOperationError) as stale:
        registry.delete_module("mod-host", "mod-1", etag=m.etag)
    assert status_of(stale) == 412
    registry.delete_module("mod-host", "mod-1", etag=updated.etag)
    assert [x.module_id for x in registry.get_modules("mod-host")] == ["mod-2"]
    with pytest.raises(HttpOperationError) as missing:
        registry.get_module("mod-host", "mod-1")
    assert status_of(missing) == 404


def test_bulk_create_100(registry):
    devices = [
        ExportImportDevice(
            id=f"bulk-{i:03}",
            import_mode="create",
            status="enabled",
            authentication=AuthenticationMechanism(type="sas", symmetric_key=SymmetricKey(primary_key=KEY_A, secondary_key=KEY_B)),
        )
        for i in range(100)
    ]
    result = registry.bulk_create_or_update_devices(devices)
    assert result.is_successful is True
    assert not result.errors
    listed = registry.get_devices()
    assert len(listed) == 100
    assert registry.get_device_registry_statistics().total_device_count == 100
    assert registry.get_device("bulk-042").authentication.symmetric_key.primary_key == KEY_A

    again = registry.bulk_create_or_update_devices(devices[:2])
    assert again.is_successful is False
    assert sorted(e.device_id for e in again.errors) == ["bulk-000", "bulk-001"]
    assert {e.error_code for e in again.errors} == {"DeviceAlreadyExists"}
