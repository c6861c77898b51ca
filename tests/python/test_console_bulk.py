"""The console's bulk work (issue 69, point 4): devices ticked on the Devices page and enabled,
disabled, deleted or tagged together (the hub's bulk registry API, `POST /devices`, and a twin
PATCH per device), each device that fails listed with the hub's reason; and the consumer groups
of the built-in endpoint listed, added and deleted on the Overview page. A real hub on the SDKs'
fixed ports: a device disabled in the console is refused by the official Python device SDK and
let back in once enabled; every change is checked against the hub's REST API.

Run under `flock /tmp/ferrohub-fixed-ports.lock` or in a network namespace of its own (the
`sdk_hub` fixture binds 443/8883/5671)."""

import urllib.parse
from pathlib import Path

import pytest
from azure.iot.device import IoTHubDeviceClient
from azure.iot.device.exceptions import ClientError, CredentialError

from consolekit import ConsoleErrors, browser, go, new_page, shot, sign_in, testid, wait_state

THUMB = "AB" * 20  # a SHA-1 thumbprint: an X.509 device whose authentication must survive


@pytest.fixture(scope="module")
def chromium():
    with browser() as b:
        yield b


@pytest.fixture
def page(chromium, sdk_hub):
    """The Devices page signed in as iothubowner; 400 and 404 answers are provoked on purpose."""
    p = new_page(chromium)
    errors = ConsoleErrors(p)
    errors.allow_status(400, 404, 409, 412)
    sign_in(p, sdk_hub)
    go(p, "devices")
    yield p
    errors.assert_none()
    p.context.close()


def q(device_id):
    return urllib.parse.quote(device_id, safe="")


def rest(hub, method, path, policy="iothubowner", **kw):
    return hub.request(method, path, hub.token(policy), **kw)


def identity(hub, device_id):
    """The device as the registry holds it, or None when it does not exist."""
    r = rest(hub, "GET", f"/devices/{q(device_id)}")
    if r.status_code == 404:
        return None
    assert r.status_code == 200, r.text
    return r.json()


def tags(hub, device_id):
    r = rest(hub, "GET", f"/twins/{q(device_id)}")
    assert r.status_code == 200, r.text
    return r.json().get("tags") or {}


def rows(page):
    return sorted(page.eval_on_selector_all("tr[data-testid=device-row]", "rs => rs.map(r => r.dataset.deviceId)"))


def reloaded(page, action):
    """Runs `action` and waits until the device list has been loaded again."""
    page.evaluate("() => { document.querySelector('main#page').dataset.state = 'loading'; }")
    action()
    return wait_state(page, ("ready", "empty", "error"))


def show(page, prefix):
    """Lists the devices whose id starts with `prefix`; returns their ids (sorted)."""
    page.fill(testid("find-prefix"), prefix)
    assert reloaded(page, lambda: page.click(testid("find"))) in ("ready", "empty")
    return rows(page)


def tick(page, *ids):
    for device_id in ids:
        page.check(f'tr[data-device-id="{device_id}"] {testid("select-device")}')


def act(page, button, confirm=None):
    """Clicks a bulk button (and the confirmation's button); waits for the outcome and the
    reloaded list; returns the outcome: "ok", "partial" or "failed"."""
    def click():
        page.click(testid(button))
        if confirm:
            page.click(testid(confirm))
    reloaded(page, click)
    page.wait_for_function("() => ['ok', 'partial', 'failed'].includes(document.querySelector('[data-testid=bulk-result]').dataset.state)")
    return page.get_attribute(testid("bulk-result"), "data-state")


def failures(page):
    """{device id: reason} of the devices the outcome lists as failed."""
    items = page.eval_on_selector_all(testid("bulk-failure"), "ls => ls.map(l => [l.dataset.deviceId, l.textContent])")
    return dict(items)


def sdk_client(hub, device_id):
    """The official SDK's client for a device, from the hub's own connection string."""
    return IoTHubDeviceClient.create_from_connection_string(
        hub.device_connection_string(device_id), server_verification_cert=Path(hub.ca).read_text())


def test_bulk_disable_refuses_the_sdk_and_enable_lets_it_back(page, sdk_hub):
    for d in ("bd-1", "bd-2", "bd-3"):
        sdk_hub.create_device(d)
    sdk_hub.create_device("bd-x509", authentication={"type": "selfSigned", "x509Thumbprint": {"primaryThumbprint": THUMB}})
    before = {d: identity(sdk_hub, d) for d in ("bd-1", "bd-2", "bd-3", "bd-x509")}
    assert show(page, "bd-") == ["bd-1", "bd-2", "bd-3", "bd-x509"]
    # Nothing ticked: the actions wait for a selection.
    assert page.locator(testid("bulk-disable")).is_disabled()
    tick(page, "bd-1", "bd-2", "bd-x509")
    assert page.inner_text(testid("bulk-count")) == "3 devices selected"
    assert page.locator(testid("select-all")).evaluate("b => b.indeterminate")
    assert act(page, "bulk-disable") == "ok"
    assert page.inner_text(testid("bulk-result")).startswith("Disabled 3 devices.")
    for d in ("bd-1", "bd-2", "bd-x509"):
        assert page.inner_text(f'tr[data-device-id="{d}"] td:nth-child(3)') == "disabled", d
    assert page.inner_text('tr[data-device-id="bd-3"] td:nth-child(3)') == "enabled"
    # The selection went with the reload.
    assert page.inner_text(testid("bulk-count")) != "3 devices selected"
    after = {d: identity(sdk_hub, d) for d in before}
    assert [d for d in after if after[d]["status"] == "disabled"] == ["bd-1", "bd-2", "bd-x509"]
    # The update carried each device's authentication: keys and thumbprints as they were.
    for d in before:
        assert after[d]["authentication"] == before[d]["authentication"], d
    assert after["bd-x509"]["authentication"]["type"] == "selfSigned"

    # A disabled device is refused by the official SDK; an untouched one connects.
    for d, refused in [("bd-1", True), ("bd-2", True), ("bd-3", False)]:
        client = sdk_client(sdk_hub, d)
        try:
            if refused:
                with pytest.raises((CredentialError, ClientError)):
                    client.connect()
            else:
                client.connect()
        finally:
            client.shutdown()

    # Select all on this page, enable: they connect again.
    page.check(testid("select-all"))
    assert page.inner_text(testid("bulk-count")) == "4 devices selected"
    assert act(page, "bulk-enable") == "ok"
    assert all(identity(sdk_hub, d)["status"] == "enabled" for d in before)
    for d in ("bd-1", "bd-2"):
        client = sdk_client(sdk_hub, d)
        try:
            client.connect()
            assert client.connected
        finally:
            client.shutdown()
    assert identity(sdk_hub, "bd-x509")["authentication"] == before["bd-x509"]["authentication"]


def test_bulk_delete_removes_exactly_the_selected_devices(page, sdk_hub):
    for d in ("bx-1", "bx-2", "bx-3", "bx-4"):
        sdk_hub.create_device(d)
    assert show(page, "bx-") == ["bx-1", "bx-2", "bx-3", "bx-4"]
    tick(page, "bx-1", "bx-3")
    # The confirmation names how many; cancelled, nothing is deleted.
    page.click(testid("bulk-delete"))
    dlg = page.wait_for_selector("dialog[open]")
    assert "Delete 2 devices?" in dlg.inner_text()
    assert "bx-1, bx-3" in dlg.inner_text()
    page.click(testid("dialog-cancel"))
    assert all(identity(sdk_hub, d) for d in ("bx-1", "bx-2", "bx-3", "bx-4"))

    assert act(page, "bulk-delete", confirm="confirm-bulk-delete") == "ok"
    assert page.inner_text(testid("bulk-result")).startswith("Deleted 2 devices.")
    assert rows(page) == ["bx-2", "bx-4"]
    assert [d for d in ("bx-1", "bx-2", "bx-3", "bx-4") if identity(sdk_hub, d)] == ["bx-2", "bx-4"]
    assert rest(sdk_hub, "GET", "/twins/bx-1").status_code == 404


def test_bulk_tag_sets_the_tag_on_exactly_the_selected_twins(page, sdk_hub):
    for d in ("bt-1", "bt-2", "bt-3"):
        sdk_hub.create_device(d)
    sdk_hub.set_tags("bt-1", {"site": "lab"})
    assert show(page, "bt-") == ["bt-1", "bt-2", "bt-3"]
    tick(page, "bt-1", "bt-2")
    page.click(testid("bulk-tag"))
    page.wait_for_selector(testid("bulk-tag-dialog"))
    assert "Tag 2 devices" in page.inner_text(testid("bulk-tag-dialog"))
    # A name with an empty part is refused in the dialog, which stays open.
    page.fill(testid("bulk-tag-name"), "zone.")
    page.fill(testid("bulk-tag-value"), "north")
    page.click(testid("bulk-tag-submit"))
    assert "empty part" in page.inner_text(".dialog-error")
    page.fill(testid("bulk-tag-name"), "zone")
    assert act(page, "bulk-tag-submit") == "ok"
    assert page.inner_text(testid("bulk-result")).startswith("Tagged 2 devices.")
    # Merged into each selected twin; the others untouched; the Tags column shows it.
    assert tags(sdk_hub, "bt-1") == {"site": "lab", "zone": "north"}
    assert tags(sdk_hub, "bt-2") == {"zone": "north"}
    assert tags(sdk_hub, "bt-3") == {}
    assert page.inner_text(f'tr[data-device-id="bt-1"] {testid("tags")}') == "site: lab, zone: north"
    assert page.inner_text(f'tr[data-device-id="bt-2"] {testid("tags")}') == "zone: north"
    assert page.inner_text(f'tr[data-device-id="bt-3"] {testid("tags")}') == "—"
    # A dotted name is a nested tag, as the search reads it; the search then finds the device.
    tick(page, "bt-3")
    page.click(testid("bulk-tag"))
    page.fill(testid("bulk-tag-name"), "location.floor")
    page.fill(testid("bulk-tag-value"), "3")
    assert act(page, "bulk-tag-submit") == "ok"
    assert tags(sdk_hub, "bt-3") == {"location": {"floor": "3"}}
    page.fill(testid("find-tag-name"), "location.floor")
    page.fill(testid("find-tag-value"), "3")
    assert reloaded(page, lambda: page.click(testid("find"))) == "ready"
    assert rows(page) == ["bt-3"]
    page.fill(testid("find-tag-name"), "")
    page.fill(testid("find-tag-value"), "")
    assert show(page, "bt-") == ["bt-1", "bt-2", "bt-3"]
    tick(page, "bt-1", "bt-2")
    shot(page, "devices-bulk")


def test_each_failed_device_is_listed_with_the_hubs_reason(page, sdk_hub):
    for d in ("bf-1", "bf-2", "bf-3", "bf-4"):
        sdk_hub.create_device(d)
    assert show(page, "bf-") == ["bf-1", "bf-2", "bf-3", "bf-4"]
    page.check(testid("select-all"))
    # Behind the page's back: bf-2 deleted, and bf-4 changed between the console's read and its
    # bulk update (so its etag no longer matches: the hub's 400 lists it, PreconditionFailed).
    assert rest(sdk_hub, "DELETE", "/devices/bf-2").status_code == 204

    def change_bf4(route):
        if route.request.method == "POST":
            cur = identity(sdk_hub, "bf-4")
            r = rest(sdk_hub, "PUT", "/devices/bf-4", json={**cur, "statusReason": "changed elsewhere"},
                     headers={"If-Match": "*"})
            assert r.status_code == 200, r.text
        route.continue_()
    is_bulk = lambda url: urllib.parse.urlparse(url).path == "/devices"  # noqa: E731
    page.route(is_bulk, change_bf4)
    try:
        assert act(page, "bulk-disable") == "partial"
    finally:
        page.unroute(is_bulk, change_bf4)
    text = page.inner_text(testid("bulk-result"))
    assert "Disabled 2 of 4 devices; 2 failed" in text, text
    failed = failures(page)
    assert sorted(failed) == ["bf-2", "bf-4"], failed
    assert "DeviceNotFound" in failed["bf-2"]
    assert "PreconditionFailed" in failed["bf-4"]
    assert identity(sdk_hub, "bf-1")["status"] == "disabled"
    assert identity(sdk_hub, "bf-3")["status"] == "disabled"
    assert identity(sdk_hub, "bf-4")["status"] == "enabled"
    assert rows(page) == ["bf-1", "bf-3", "bf-4"]

    # A bulk delete of a device gone meanwhile: the hub's 400 names it, the others go.
    page.check(testid("select-all"))
    assert rest(sdk_hub, "DELETE", "/devices/bf-3").status_code == 204
    assert act(page, "bulk-delete", confirm="confirm-bulk-delete") == "partial"
    failed = failures(page)
    assert list(failed) == ["bf-3"] and "DeviceNotFound" in failed["bf-3"], failed
    assert identity(sdk_hub, "bf-1") is None and identity(sdk_hub, "bf-4") is None
    assert show(page, "bf-") == []
    # The outcome stays until dismissed.
    page.click(testid("bulk-dismiss"))
    assert page.inner_text(testid("bulk-result")) == ""


def test_a_read_only_policy_sees_the_bulk_actions_disabled(chromium, sdk_hub):
    sdk_hub.create_device("ro-1")
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    errors.allow_status(401)
    sign_in(page, sdk_hub, policy="registryRead")
    go(page, "devices")
    assert show(page, "ro-") == ["ro-1"]
    tick(page, "ro-1")  # ticking works; acting does not
    for button, right in [("bulk-enable", "RegistryWrite"), ("bulk-disable", "RegistryWrite"),
                          ("bulk-delete", "RegistryWrite"), ("bulk-tag", "ServiceConnect")]:
        b = page.locator(testid(button))
        assert b.is_disabled(), button
        assert right in b.get_attribute("title"), button
    # Forced anyway: the hub refuses with 401, shown for the device, not swallowed.
    page.evaluate("() => { document.querySelector('[data-testid=\"bulk-delete\"]').disabled = false; }")
    assert act(page, "bulk-delete", confirm="confirm-bulk-delete") == "failed"
    assert "401" in failures(page)["ro-1"]
    assert identity(sdk_hub, "ro-1") is not None
    # The consumer groups need ServiceConnect too.
    go(page, "overview")
    page.wait_for_selector(f'{testid("consumer-groups")}[data-state=empty]')
    assert "Needs ServiceConnect" in page.inner_text(testid("consumer-groups"))
    assert page.locator(testid("consumer-group-add")).is_disabled()
    errors.assert_none()
    page.context.close()


def group_names(hub):
    r = rest(hub, "GET", "/events/consumergroups", policy="service")
    assert r.status_code == 200, r.text
    return r.json()


def test_consumer_groups_are_listed_added_and_deleted(chromium, sdk_hub):
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    errors.allow_status(400, 409)
    sign_in(page, sdk_hub)
    go(page, "overview")
    listed = f'{testid("consumer-groups")}[data-state=ready]'
    page.wait_for_selector(listed)
    names = lambda: page.eval_on_selector_all(testid("consumer-group-row"), "rs => rs.map(r => r.dataset.group)")  # noqa: E731
    assert names() == group_names(sdk_hub) == ["$Default"]
    # $Default cannot be deleted: its button says why, and the hub refuses it anyway (400).
    default_delete = page.locator(f'tr[data-group="$Default"] {testid("consumer-group-delete")}')
    assert default_delete.is_disabled()
    assert "always exists" in default_delete.get_attribute("title")
    r = rest(sdk_hub, "DELETE", "/events/consumergroups/$Default", policy="service")
    assert r.status_code == 400, r.text
    # Reading with a group that does not exist is a 404 ...
    r = rest(sdk_hub, "GET", "/events/consumergroups/console-readers/partitions/0/messages", policy="service")
    assert r.status_code == 404, r.text

    page.fill(testid("consumer-group-name"), "console-readers")
    page.click(testid("consumer-group-add"))
    page.wait_for_selector(f'{testid("consumer-group-row")}[data-group="console-readers"]')
    assert group_names(sdk_hub) == ["$Default", "console-readers"]
    assert page.input_value(testid("consumer-group-name")) == ""
    assert page.inner_text(testid("consumer-group-count")) == "2 of 20 in use."
    # ... and once added, the read API reads with it.
    assert sdk_hub.read_partition(0, group="console-readers") == sdk_hub.read_partition(0)

    # A bad name and a name taken: the hub's 400 and 409, shown under the form.
    page.fill(testid("consumer-group-name"), "bad name!")
    page.click(testid("consumer-group-add"))
    err = page.wait_for_selector(f'{testid("consumer-group-error")} .error-state')
    assert "HTTP 400" in err.inner_text() and "1 to 50 letters" in err.inner_text(), err.inner_text()
    assert page.input_value(testid("consumer-group-name")) == "bad name!"  # kept, to be corrected
    page.fill(testid("consumer-group-name"), "console-readers")
    page.click(testid("consumer-group-add"))
    page.wait_for_function("() => document.querySelector('[data-testid=consumer-group-error]').textContent.includes('409')")
    assert group_names(sdk_hub) == ["$Default", "console-readers"]
    page.fill(testid("consumer-group-name"), "analytics")
    page.click(testid("consumer-group-add"))
    page.wait_for_selector(f'{testid("consumer-group-row")}[data-group="analytics"]')
    assert page.inner_text(testid("consumer-group-error")) == ""
    shot(page, "overview-consumer-groups", at=testid("consumer-groups-card"))

    # Delete, after a confirmation.
    page.click(f'tr[data-group="console-readers"] {testid("consumer-group-delete")}')
    page.click(testid("confirm-group-delete"))
    page.wait_for_function("() => !document.querySelector('tr[data-group=\"console-readers\"]')")
    page.wait_for_selector(listed)
    assert names() == group_names(sdk_hub) == ["$Default", "analytics"]
    r = rest(sdk_hub, "GET", "/events/consumergroups/console-readers/partitions/0/messages", policy="service")
    assert r.status_code == 404, r.text
    errors.assert_none()
    page.context.close()
