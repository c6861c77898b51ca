"""The console's Provisioning page (docs/console.md, "Provisioning") in a real headless Chromium
against a real hub on the SDKs' fixed ports, with the official Python device SDK
(`ProvisioningDeviceClient`, then `IoTHubDeviceClient`) on the other side and the DPS service
API (signed with provisioningserviceowner, as test_dps_python.py does) as the referee:

- An individual symmetric-key enrollment created in the console (device id, initial twin) admits
  the SDK with the key the console's attestation view shows; the device connects and sends; the
  console's registration record shows it assigned; its twin holds the initial tag.
- X.509 enrollments created in the console from pasted PEM certificates (an individual leaf, a
  group's signing CA) admit the SDK presenting those certificates.
- A symmetric-key group created in the console: the key it derives for a registration id is the
  HMAC computed here; the SDK registers with it; the group's registrations list shows it.
- An edit saved with a stale etag is refused (412, shown in the dialog) and nothing is
  overwritten; disabling in the console makes the SDK's next registration fail, enabling lets
  it in again.
- Deleting in the console removes the enrollment or group (the service API answers 404).
- A policy without all four rights (registryRead) sees the ID scope, no keys, a note, and no
  enrollment action enabled.
- The ID scope and the provisioning connection string are copied as the CLI prints them; the
  page fits a phone; screenshots at 1,280 x 800 and 390 x 844.

Run under `flock /tmp/ferrohub-fixed-ports.lock` or in a network namespace of its own (the
`sdk_hub` fixture binds 443/8883/5671)."""

import json

import pytest
from azure.iot.device import X509

import certs
from consolekit import PHONE, ConsoleErrors, browser, go, new_page, shot, sign_in, testid
from test_dps_python import (HOST, derived_key, dps, id_scope, ok, put_enrollment, put_group, refused_once_seen, register,
                             register_refused, send_telemetry, twin, wait_for_event)

OWNER = "provisioningserviceowner"
# What the SDK (2.14) raises when a registration ends "disabled" (test_dps_python.py).
DISABLED = "Query Status Operation encountered an invalid registration status disabled with a status code of 200"


@pytest.fixture(scope="module")
def chromium():
    with browser() as b:
        yield b


@pytest.fixture
def page(chromium, sdk_hub):
    """The Provisioning page signed in as iothubowner. A registration record not written yet
    answers 404 and a stale edit 412, both on purpose."""
    p = new_page(chromium)
    errors = ConsoleErrors(p)
    errors.allow_status(404, 412)
    sign_in(p, sdk_hub)
    go(p, "provisioning")
    yield p
    errors.assert_none()
    p.context.close()


# -- helpers -------------------------------------------------------------------------------------
def record_row(listing: str, record_id: str) -> str:
    """The row of an enrollment (`listing` = "enrollments") or group ("groups")."""
    return f'{testid(listing)} tr[data-record="{record_id}"]'


def enrollment(hub, registration_id: str, kind: str = "enrollments") -> dict:
    return ok(dps(hub, "GET", f"/{kind}/{registration_id}"))


def attestation_keys(hub, record_id: str, kind: str = "enrollments") -> dict:
    return ok(dps(hub, "POST", f"/{kind}/{record_id}/attestationmechanism"))["symmetricKey"]


def create_in_console(page, kind: str, record_id: str, device_id: str | None = None, tags=None, desired=None,
                      pem: str | None = None):
    """Fills the New enrollment (kind "enrollments") or New group ("groups") dialog and waits
    for the record's row."""
    page.click(testid("new-enrollment" if kind == "enrollments" else "new-group"))
    dlg = testid("enrollment-dialog" if kind == "enrollments" else "group-dialog")
    page.wait_for_selector(dlg)
    page.fill(testid("form-id"), record_id)
    if device_id is not None:
        page.fill(testid("form-device-id"), device_id)
    if pem is not None:
        page.select_option(testid("form-attestation"), "x509")
        page.fill(testid("form-certificate"), pem)
    if tags is not None:
        page.fill(testid("form-tags"), json.dumps(tags))
    if desired is not None:
        page.fill(testid("form-desired"), json.dumps(desired))
    page.click(testid("form-save"))
    page.wait_for_selector(dlg, state="detached")
    page.wait_for_selector(record_row(kind, record_id))


def open_detail(page, kind: str, record_id: str) -> str:
    """Opens a record's details below its list; returns the panel's selector."""
    page.click(f'{record_row(kind, record_id)} {testid("open")}')
    panel = f'{testid("enrollment-detail" if kind == "enrollments" else "group-detail")}[data-record="{record_id}"]'
    page.wait_for_selector(panel)
    return panel


def shown_keys(page) -> dict:
    """The keys the console's attestation view shows (then closes it)."""
    page.click(testid("show-attestation"))
    page.wait_for_selector(testid("attestation-dialog"))
    keys = {"primaryKey": page.input_value(testid("attestation-primary-key")),
            "secondaryKey": page.input_value(testid("attestation-secondary-key"))}
    page.click(testid("dialog-close"))
    page.wait_for_selector(testid("attestation-dialog"), state="detached")
    return keys


def refresh_list(page, kind: str):
    """Reads the list again (the Refresh button) and waits until it is drawn."""
    page.evaluate("(l) => { document.querySelector(`[data-testid=${l}]`).dataset.state = 'loading'; }", kind)
    page.click(testid(f"{kind}-refresh"))
    page.wait_for_selector(f'{testid(kind)}:is([data-state=ready], [data-state=empty], [data-state=error])')
    assert page.get_attribute(testid(kind), "data-state") != "error", page.inner_text(testid(kind))


# -- tests ---------------------------------------------------------------------------------------
def test_an_enrollment_created_in_the_console_provisions_an_sdk_device(page, sdk_hub):
    hub, rid, device_id = sdk_hub, "console-reg-1", "console-dev-1"
    # Nothing enrolled yet: the lists say so and what to do.
    page.wait_for_selector(f'{testid("enrollments")}[data-state=empty]')
    assert "No individual enrollments yet" in page.inner_text(testid("enrollments-empty"))
    assert "No enrollment groups yet" in page.inner_text(testid("groups-empty"))
    # The ID scope and the endpoint, as the CLI prints them; copy puts the scope on the clipboard.
    scope = id_scope(hub)
    assert page.inner_text(testid("id-scope")) == scope
    assert page.inner_text(testid("global-endpoint")) == HOST
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.click(testid("copy-id-scope"))
    page.wait_for_selector(f"{testid('toast')}:has-text('Copied')")
    assert page.evaluate("navigator.clipboard.readText()") == scope
    # The connection string stays hidden until Show; then it is the CLI's, and copies.
    assert page.inner_text(testid(f"provisioning-keys-{OWNER}")) == ""
    assert page.locator(testid(f"provisioning-connection-string-{OWNER}")).count() == 0
    page.click(testid(f"show-connection-string-{OWNER}"))
    cs = page.inner_text(testid(f"provisioning-connection-string-{OWNER}"))
    assert cs == hub.cli("connection-string", "--provisioning"), cs
    page.evaluate("() => document.querySelectorAll('.toast').forEach((t) => t.remove())")
    page.click(testid(f"copy-provisioning-connection-string-{OWNER}"))
    page.wait_for_selector(f"{testid('toast')}:has-text('Copied')")
    assert page.evaluate("navigator.clipboard.readText()") == cs
    page.click(testid(f"hide-connection-string-{OWNER}"))
    assert page.locator(testid(f"provisioning-connection-string-{OWNER}")).count() == 0

    create_in_console(page, "enrollments", rid, device_id=device_id, tags={"site": "lab-7"}, desired={"interval": 30})
    stored = enrollment(hub, rid)
    assert stored["deviceId"] == device_id and stored["provisioningStatus"] == "enabled"
    assert stored["attestation"]["type"] == "symmetricKey"
    assert stored["initialTwin"] == {"tags": {"site": "lab-7"}, "properties": {"desired": {"interval": 30}}}
    row = record_row("enrollments", rid)
    assert page.inner_text(f"{row} td[data-label='Device id']") == device_id
    assert page.get_attribute(f"{row} {testid('status')}", "data-status") == "enabled"

    # Its keys, as the console shows them, are the service's (generated, since none were given).
    panel = open_detail(page, "enrollments", rid)
    keys = shown_keys(page)
    assert keys == attestation_keys(hub, rid) and keys["primaryKey"] != keys["secondaryKey"]
    # Not registered yet: the record view says so.
    page.wait_for_selector(f'{panel} {testid("registration-record")}[data-state=empty]')
    assert "no device has registered" in page.inner_text(testid("registration-none"))

    state = register(hub, rid, key=keys["primaryKey"]).registration_state
    assert (state.assigned_hub, state.device_id) == (HOST, device_id)
    send_telemetry(hub, state, "hello from a console enrollment", key=keys["primaryKey"])
    wait_for_event(hub, device_id, "hello from a console enrollment")

    page.click(testid("registration-refresh"))
    page.wait_for_selector(f'{panel} {testid("registration-record")}[data-state=ready]')
    assert page.get_attribute(f'{panel} {testid("registration-status")}', "data-status") == "assigned"
    assert page.inner_text(f'{panel} {testid("registration-hub")}') == HOST
    assert page.inner_text(f'{panel} {testid("registration-device")}') == device_id
    record = ok(dps(hub, "GET", f"/registrations/{rid}"))
    assert record["etag"] in page.inner_text(testid("registration-facts"))
    t = twin(hub, device_id)
    assert t["tags"] == {"site": "lab-7"}, t
    assert t["properties"]["desired"]["interval"] == 30, t


def test_x509_enrollments_created_in_the_console_admit_their_certificates(page, sdk_hub, tmp_path):
    hub = sdk_hub
    # An individual enrollment holding the device's own (self-signed) certificate, pasted.
    leaf, leaf_key = certs.self_signed(tmp_path, "console-x509-self")
    create_in_console(page, "enrollments", "console-x509-self", pem=leaf.read_text())
    info = enrollment(hub, "console-x509-self")["attestation"]["x509"]["clientCertificates"]["primary"]["info"]
    assert info["sha1Thumbprint"].upper() == certs.thumbprint(leaf).upper()
    assert "console-x509-self" in page.inner_text(f"{record_row('enrollments', 'console-x509-self')} td[data-label=Attestation]")
    open_detail(page, "enrollments", "console-x509-self")
    page.click(testid("show-attestation"))
    page.wait_for_selector(testid("attestation-dialog"))
    assert page.inner_text(testid("certificate-sha1-primary")).upper() == certs.thumbprint(leaf).upper()
    page.click(testid("dialog-close"))
    # A group whose signing certificate is a CA: a device it signed registers.
    ca, ca_key = certs.ca(tmp_path, "console-fleet-ca")
    member, member_key = certs.signed_by(tmp_path, "console-x509-member", ca, ca_key)
    create_in_console(page, "groups", "console-x509-fleet", pem=ca.read_text())
    group = enrollment(hub, "console-x509-fleet", "enrollmentGroups")
    assert group["attestation"]["x509"]["signingCertificates"]["primary"]["info"]["sha1Thumbprint"].upper() == \
        certs.thumbprint(ca).upper()

    for rid, cert, key in [("console-x509-self", leaf, leaf_key), ("console-x509-member", member, member_key)]:
        state = register(hub, rid, x509=X509(cert_file=str(cert), key_file=str(key))).registration_state
        assert (state.assigned_hub, state.device_id) == (HOST, rid)
    panel = open_detail(page, "groups", "console-x509-fleet")
    page.wait_for_selector(f'{panel} {testid("group-registrations")} tr[data-registration="console-x509-member"]')
    # An X.509 group has no key to derive from.
    assert page.locator(f'{panel} {testid("derive-key")}').count() == 0


def test_a_group_created_in_the_console_derives_the_keys_its_devices_register_with(page, sdk_hub):
    hub, group, rid = sdk_hub, "console-fleet", "console-fleet-007"
    create_in_console(page, "groups", group, tags={"fleet": "console"})
    panel = open_detail(page, "groups", group)
    page.wait_for_selector(f'{panel} {testid("group-registrations")}[data-state=empty]')
    group_keys = attestation_keys(hub, group, "enrollmentGroups")
    assert shown_keys(page) == group_keys

    # The key the console derives (Web Crypto in the tab) is the HMAC computed here.
    page.fill(testid("derive-registration-id"), rid)
    page.click(testid("derive-key"))
    page.wait_for_selector(f'{testid("derive-result")}[data-registration-id="{rid}"]')
    derived = page.inner_text(testid("derived-key"))
    assert derived == derived_key(group_keys["primaryKey"], rid), derived
    # Another id, another key (the form derives what it is given).
    page.fill(testid("derive-registration-id"), "console-fleet-008")
    page.click(testid("derive-key"))
    page.wait_for_selector(f'{testid("derive-result")}[data-registration-id="console-fleet-008"]')
    assert page.inner_text(testid("derived-key")) == derived_key(group_keys["primaryKey"], "console-fleet-008") != derived

    state = register(hub, rid, key=derived).registration_state
    assert (state.assigned_hub, state.device_id) == (HOST, rid)
    assert twin(hub, rid)["tags"] == {"fleet": "console"}
    page.click(testid("group-registrations-refresh"))
    member = f'{panel} {testid("group-registrations")} tr[data-registration="{rid}"]'
    page.wait_for_selector(member)
    assert page.get_attribute(f'{member} {testid("registration-status")}', "data-status") == "assigned"
    listed = ok(dps(hub, "POST", f"/registrations/{group}/query", json={}))
    assert [r["registrationId"] for r in listed] == [rid]
    assert page.eval_on_selector_all(f'{panel} {testid("group-registrations")} tr[data-registration]',
                                     "rs => rs.map(r => r.dataset.registration)") == [rid]


def test_a_stale_edit_is_refused_and_disable_stops_the_next_registration(page, sdk_hub):
    hub, rid = sdk_hub, "console-etag"
    created = put_enrollment(hub, rid, initialTwin={"tags": {"v": 1}})
    key = created["attestation"]["symmetricKey"]["primaryKey"]
    refresh_list(page, "enrollments")
    row = record_row("enrollments", rid)
    assert page.get_attribute(row, "data-etag") == created["etag"]

    page.click(f"{row} {testid('edit')}")
    page.wait_for_selector(testid("enrollment-dialog"))
    assert created["etag"] in page.inner_text(testid("form-etag"))
    assert json.loads(page.input_value(testid("form-tags"))) == {"v": 1}
    # Behind the page's back, the enrollment changes.
    changed = ok(dps(hub, "PUT", f"/enrollments/{rid}", headers={"If-Match": f'"{created["etag"]}"'}, json={
        "registrationId": rid, "attestation": {"type": "symmetricKey"}, "initialTwin": {"tags": {"v": 2, "by": "python"}}}))
    assert changed["etag"] != created["etag"]
    page.fill(testid("form-device-id"), "console-etag-device")
    page.fill(testid("form-tags"), json.dumps({"v": 3}))
    page.click(testid("form-save"))
    page.wait_for_function("() => document.querySelector('dialog[open] .dialog-error')?.textContent.includes('412')")
    text = page.inner_text("dialog[open] .dialog-error")
    assert "412 412001" in text and "nothing was saved" in text, text
    # Nothing was overwritten.
    now = enrollment(hub, rid)
    assert now["etag"] == changed["etag"] and now["initialTwin"]["tags"] == {"v": 2, "by": "python"}
    assert "deviceId" not in now
    # Closing the dialog reads the list again: the row carries the new etag.
    page.click(testid("dialog-cancel"))
    page.wait_for_selector(f'{row}[data-etag="{changed["etag"]}"]')

    # Registered once, then disabled in the console: the SDK's next registration fails.
    register(hub, rid, key=key)
    page.click(f"{row} {testid('toggle')}")
    page.wait_for_selector(f'{row}[data-status=disabled]')
    now = enrollment(hub, rid)
    assert now["provisioningStatus"] == "disabled"
    assert now["initialTwin"]["tags"] == {"v": 2, "by": "python"}  # the rest of the record kept
    assert attestation_keys(hub, rid)["primaryKey"] == key  # and its keys
    register_refused(hub, rid, why=DISABLED, key=key)
    # Enabled again in the console: admitted again.
    page.click(f"{row} {testid('toggle')}")
    page.wait_for_selector(f'{row}[data-status=enabled]')
    assert enrollment(hub, rid)["provisioningStatus"] == "enabled"
    assert register(hub, rid, key=key).registration_state.device_id == rid
    assert page.inner_text(testid("enrollments-error")) == ""


def test_delete_in_the_console_removes_the_enrollment(page, sdk_hub):
    hub = sdk_hub
    put_enrollment(hub, "console-delete")
    put_group(hub, "console-delete-group", {"type": "symmetricKey"})
    refresh_list(page, "enrollments")
    refresh_list(page, "groups")
    row = record_row("enrollments", "console-delete")
    # Cancelled: nothing is deleted.
    page.click(f"{row} {testid('delete')}")
    dlg = page.wait_for_selector("dialog[open]")
    assert "Delete the enrollment console-delete?" in dlg.inner_text()
    page.click(testid("dialog-cancel"))
    assert enrollment(hub, "console-delete")["registrationId"] == "console-delete"
    # Confirmed: gone from the page and from the service.
    page.click(f"{row} {testid('delete')}")
    page.click(testid("confirm-delete"))
    page.wait_for_selector(row, state="detached")
    refused_once_seen(lambda: dps(hub, "GET", "/enrollments/console-delete"), 404, 404201)

    group_row = record_row("groups", "console-delete-group")
    page.click(f"{group_row} {testid('delete')}")
    page.click(testid("confirm-delete"))
    page.wait_for_selector(group_row, state="detached")
    refused_once_seen(lambda: dps(hub, "GET", "/enrollmentGroups/console-delete-group"), 404, 404202)
    # The others are still listed.
    assert page.locator(record_row("enrollments", "console-reg-1")).count() == 1
    assert page.locator(record_row("groups", "console-fleet")).count() == 1


def test_a_policy_without_every_right_sees_the_scope_and_no_keys(chromium, sdk_hub):
    hub = sdk_hub
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    sign_in(page, hub, policy="registryRead")
    go(page, "provisioning")
    assert page.inner_text(testid("id-scope")) == id_scope(hub)
    note = page.inner_text(testid("provisioning-denied"))
    assert "all four rights" in note and "registryRead" in note and "RegistryWrite" in note, note
    # No keys anywhere, and nothing to press in the enrollment sections.
    assert page.locator(testid(f"provisioning-connection-string-{OWNER}")).count() == 0
    show = page.locator(testid(f"show-connection-string-{OWNER}"))
    assert show.is_disabled() and "RegistryWrite" in show.get_attribute("title")
    buttons = page.locator(f'{testid("enrollments-card")} button, {testid("groups-card")} button')
    assert buttons.count() >= 4
    assert all(buttons.nth(i).is_disabled() for i in range(buttons.count()))
    assert page.locator(testid("enrollments-table")).count() == 0
    assert "need a policy holding all four rights" in page.inner_text(testid("enrollments-denied"))
    # The hub refuses the keys to this policy anyway.
    r = hub.request("GET", f"/console/api/provisioning/policies/{OWNER}/keys", hub.token("registryRead"))
    assert r.status_code == 401, r.text
    errors.assert_none()
    page.context.close()


def test_the_page_fits_a_phone_and_works_from_the_keyboard(chromium, sdk_hub, page):
    # At 1,280 x 800: the lists as the tests above left them, a group's details open below.
    panel = open_detail(page, "groups", "console-fleet")
    page.fill(testid("derive-registration-id"), "console-fleet-007")
    page.click(testid("derive-key"))
    page.wait_for_selector(f'{panel} {testid("group-registrations")}[data-state=ready]')
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 1280, f"the page is {width}px wide at 1280px"
    shot(page, "provisioning")
    shot(page, "provisioning-group", at=panel)

    # New enrollment opens from the keyboard, focus in its first field, Escape closes it.
    page.focus(testid("new-enrollment"))
    page.keyboard.press("Enter")
    page.wait_for_selector(testid("enrollment-dialog"))
    assert page.evaluate("() => document.activeElement.dataset.testid") == "form-id"
    page.keyboard.press("Escape")
    page.wait_for_selector(testid("enrollment-dialog"), state="detached")

    phone = new_page(chromium, viewport=PHONE)
    errors = ConsoleErrors(phone)
    errors.allow_status(404)
    try:
        sign_in(phone, sdk_hub)
        go(phone, "provisioning")
        phone.wait_for_selector(record_row("enrollments", "console-reg-1"))
        open_detail(phone, "enrollments", "console-reg-1")
        phone.wait_for_selector(f'{testid("registration-record")}[data-state=ready]')
        width = phone.evaluate("() => document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"the page is {width}px wide at {PHONE['width']}px"
        shot(phone, "provisioning-phone", at=testid("enrollments-card"))
        errors.assert_none()
    finally:
        phone.context.close()
