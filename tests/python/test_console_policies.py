"""The console's Shared access policies page changing the policies (what IoT Hub's portal does
under "Shared access policies"), in a real headless Chromium against a real hub: a policy added
in the console signs REST calls and the official service SDK with the keys the console shows;
changed rights take effect on the same key; a regenerated key replaces only that key; a removed
policy signs nothing; the hub's refusals (removing the only all-rights policy, a bad name) are
shown and change nothing; regenerating the key the console itself signs with keeps the console
working; removing the signed-in policy signs the console out; a policy without all four rights
finds every change button disabled. Every effect is read back through the hub (REST with SAS
tokens signed here, and the `ferrohub connection-string` CLI, which reads the hub's store)."""

import json
import urllib.parse

import pytest
from azure.iot.hub import IoTHubRegistryManager

from consolekit import PHONE, ConsoleErrors, browser, go, new_page, shot, sign_in, testid, wait_state
from hubkit import sas_token

ALL = ["RegistryRead", "RegistryWrite", "ServiceConnect", "DeviceConnect"]


@pytest.fixture(scope="module")
def chromium():
    with browser() as b:
        yield b


@pytest.fixture
def page(chromium):
    p = new_page(chromium)
    yield p
    p.context.close()


# -- helpers --------------------------------------------------------------------------------------

def signed(hub, name, key):
    """A hub-scoped SAS token signed here with a policy's key."""
    return sas_token(f"localhost:{hub.port}", key, policy=name)


def status(hub, method, path, name, key, **kw):
    return hub.request(method, path, signed(hub, name, key), **kw).status_code


def listed(hub):
    """{name: rights} as the hub lists them (iothubowner's key, read from the store)."""
    r = hub.request("GET", "/console/api/policies", hub.token("iothubowner"))
    assert r.status_code == 200, r.text
    return {p["keyName"]: p["rights"] for p in r.json()}


def keys(hub, name):
    r = hub.request("GET", f"/console/api/policies/{urllib.parse.quote(name, safe='')}/keys", hub.token("iothubowner"))
    assert r.status_code == 200, r.text
    return r.json()


def reloaded(page, action):
    """Runs `action` (which ends a dialog with a change) and waits for the list read again."""
    page.evaluate("() => { document.querySelector('main#page').dataset.state = 'changing'; }")
    action()
    return wait_state(page, ("ready", "empty", "error"))


def shown_keys(page, name):
    """Clicks "Show keys" on a policy's card; (primary, secondary, connection string) shown."""
    page.click(testid(f"show-keys-{name}"))
    page.wait_for_selector(testid(f"primary-key-{name}"))
    return (page.inner_text(testid(f"primary-key-{name}")), page.inner_text(testid(f"secondary-key-{name}")),
            page.inner_text(testid(f"connection-string-{name}")))


def rights_shown(page, name):
    return page.eval_on_selector_all(f'{testid(f"rights-{name}")} .badge', "bs => bs.map(b => b.textContent)")


def save_dialog(page, button="policy-save", dialog="policy-dialog"):
    def run():
        page.click(testid(button))
        page.wait_for_selector(testid(dialog), state="detached")
    return reloaded(page, run)


def dialog_error(page):
    """The refusal shown in the open dialog (the dialog stays open)."""
    el = page.wait_for_selector("dialog[open] .dialog-error:not(:empty)")
    return el.inner_text()


def stored_session(page):
    return json.loads(page.evaluate("() => sessionStorage.getItem('ferrohub.console.session')") or "null")


# -- add, edit, regenerate, remove ----------------------------------------------------------------

def test_policy_added_edited_rekeyed_and_removed_in_the_console(hub, page, monkeypatch):
    errors = ConsoleErrors(page)
    hub.create_device("pol-probe")
    sign_in(page, hub)
    assert go(page, "policies") == "ready"
    assert page.locator('[data-policy="ops"]').count() == 0

    # 1. Add `ops` with RegistryRead + ServiceConnect. RegistryWrite ticks and holds RegistryRead.
    page.click(testid("add-policy"))
    page.wait_for_selector(testid("policy-dialog"))
    assert page.evaluate("() => document.activeElement.dataset.testid") == "policy-name"
    page.fill(testid("policy-name"), "ops")
    read, write = page.locator(testid("policy-right-RegistryRead")), page.locator(testid("policy-right-RegistryWrite"))
    assert not read.is_checked() and read.is_enabled()
    write.check()
    assert read.is_checked() and read.is_disabled()
    write.uncheck()
    assert read.is_checked() and read.is_enabled()
    page.check(testid("policy-right-ServiceConnect"))
    assert save_dialog(page) == "ready"
    assert rights_shown(page, "ops") == ["RegistryRead", "ServiceConnect"]
    assert listed(hub)["ops"] == "RegistryRead, ServiceConnect"

    primary, secondary, cs = shown_keys(page, "ops")
    assert primary == hub.policy_key("ops") and secondary != primary
    assert cs == f"HostName=localhost:{hub.port};SharedAccessKeyName=ops;SharedAccessKey={primary}"
    assert status(hub, "GET", "/devices/pol-probe", "ops", primary) == 200
    assert status(hub, "GET", "/devices/pol-probe", "ops", secondary) == 200
    assert status(hub, "PUT", "/devices/by-ops", "ops", primary, json={"deviceId": "by-ops"}) == 401
    # The official service SDK, with the connection string the console shows.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", hub.ca)
    manager = IoTHubRegistryManager.from_connection_string(cs)
    manager.protocol.config.connection.verify = hub.ca
    assert manager.get_device("pol-probe").device_id == "pol-probe"

    # 2. Edit its rights: RegistryWrite added, keys kept; the same key now writes.
    page.click(testid("edit-policy-ops"))
    page.wait_for_selector(testid("policy-dialog"))
    ticked = {r: page.is_checked(testid(f"policy-right-{r}")) for r in ALL}
    assert ticked == {"RegistryRead": True, "RegistryWrite": False, "ServiceConnect": True, "DeviceConnect": False}
    page.check(testid("policy-right-RegistryWrite"))
    assert save_dialog(page) == "ready"
    assert rights_shown(page, "ops") == ["RegistryRead", "RegistryWrite", "ServiceConnect"]
    assert listed(hub)["ops"] == "RegistryRead, RegistryWrite, ServiceConnect"
    assert keys(hub, "ops") == {"primaryKey": primary, "secondaryKey": secondary}
    assert status(hub, "PUT", "/devices/by-ops", "ops", primary, json={"deviceId": "by-ops"}) == 200

    # 3. Regenerate its secondary key: the confirmation names what breaks; cancelled, nothing changes.
    page.click(testid("regenerate-secondary-ops"))
    dlg = page.wait_for_selector(testid("regenerate-dialog"))
    assert "secondary key of ops" in dlg.inner_text() and "refused" in dlg.inner_text()
    page.click(testid("dialog-cancel"))
    page.wait_for_selector(testid("regenerate-dialog"), state="detached")
    assert keys(hub, "ops") == {"primaryKey": primary, "secondaryKey": secondary}
    page.click(testid("regenerate-secondary-ops"))
    assert save_dialog(page, "confirm-regenerate", "regenerate-dialog") == "ready"
    new_primary, new_secondary, _ = shown_keys(page, "ops")
    assert new_primary == primary
    assert new_secondary != secondary
    assert keys(hub, "ops") == {"primaryKey": primary, "secondaryKey": new_secondary}
    assert status(hub, "GET", "/devices/pol-probe", "ops", secondary) == 401
    assert status(hub, "GET", "/devices/pol-probe", "ops", new_secondary) == 200
    assert status(hub, "GET", "/devices/pol-probe", "ops", primary) == 200

    # 6. Remove it (after a cancelled first try): its keys sign nothing, the store no longer has it.
    page.click(testid("remove-policy-ops"))
    page.wait_for_selector(testid("remove-dialog"))
    assert page.locator(testid("remove-self-warning")).count() == 0  # not the signed-in policy
    page.click(testid("dialog-cancel"))
    assert "ops" in listed(hub)
    page.click(testid("remove-policy-ops"))
    assert save_dialog(page, "confirm-remove", "remove-dialog") == "ready"
    assert page.locator('[data-policy="ops"]').count() == 0
    assert "ops" not in listed(hub)
    assert status(hub, "GET", "/devices/pol-probe", "ops", primary) == 401
    assert status(hub, "GET", "/devices/pol-probe", "ops", new_secondary) == 401
    with pytest.raises(RuntimeError, match="no policy named"):
        hub.cli("connection-string", "--policy", "ops")
    errors.assert_none()


# -- refusals ---------------------------------------------------------------------------------------

def test_refusals_are_shown_and_change_nothing(hub, page):
    errors = ConsoleErrors(page)
    errors.allow_status(400)
    sign_in(page, hub)
    assert go(page, "policies") == "ready"
    before = listed(hub)
    owner_keys = keys(hub, "iothubowner")

    # 4. Removing iothubowner, the only policy with all four rights: warned (it is the signed-in
    # one), then the hub's 400 in the dialog, which stays open; nothing changes, still signed in.
    page.click(testid("remove-policy-iothubowner"))
    page.wait_for_selector(testid("remove-dialog"))
    assert "signed out" in page.inner_text(testid("remove-self-warning"))
    page.click(testid("confirm-remove"))
    text = dialog_error(page)
    assert text.startswith("400 ") and "all four rights" in text, text
    assert page.is_visible(testid("remove-dialog"))
    page.click(testid("dialog-cancel"))
    page.wait_for_selector(testid("remove-dialog"), state="detached")
    assert listed(hub) == before and keys(hub, "iothubowner") == owner_keys
    assert page.evaluate("() => location.hash") == "#/policies"
    assert (stored_session(page) or {}).get("key") == owner_keys["primaryKey"]
    assert page.inner_text("#whoami") == "iothubowner"

    # A bad name: the hub's 400 and its rule, in the dialog.
    page.click(testid("add-policy"))
    page.fill(testid("policy-name"), "bad name")
    page.check(testid("policy-right-DeviceConnect"))
    page.click(testid("policy-save"))
    text = dialog_error(page)
    assert text.startswith("400 ") and "letters, digits" in text, text
    # An existing name is "Edit rights", not a new policy: refused before any request.
    page.fill(testid("policy-name"), "service")
    page.click(testid("policy-save"))
    page.wait_for_function("() => document.querySelector('dialog[open] .dialog-error').textContent.includes('exists already')")
    page.click(testid("dialog-cancel"))
    page.wait_for_selector(testid("policy-dialog"), state="detached")
    assert listed(hub) == before
    errors.assert_none()


def test_add_is_disabled_at_sixteen_policies(hub, page):
    owner = hub.token("iothubowner")
    n = len(listed(hub))
    for i in range(16 - n):
        r = hub.request("PUT", f"/console/api/policies/filler-{i}", owner, json={"rights": ["RegistryRead"]})
        assert r.status_code == 200, r.text
    assert len(listed(hub)) == 16
    sign_in(page, hub)
    assert go(page, "policies") == "ready"
    add = page.locator(testid("add-policy"))
    assert add.is_disabled()
    assert "at most 16" in add.get_attribute("title")
    # One removed in the console: there is room again.
    page.click(testid("remove-policy-filler-0"))
    assert save_dialog(page, "confirm-remove", "remove-dialog") == "ready"
    assert add.is_enabled()


# -- the signed-in policy -----------------------------------------------------------------------------

def test_regenerating_the_key_the_console_signs_with_keeps_it_working(hub, page):
    errors = ConsoleErrors(page)
    hub.create_device("after-rekey")
    sign_in(page, hub)  # with iothubowner's primary key
    old = keys(hub, "iothubowner")
    assert go(page, "policies") == "ready"

    # 5. The confirmation says the console switches itself.
    page.click(testid("regenerate-primary-iothubowner"))
    page.wait_for_selector(testid("regenerate-dialog"))
    assert "switches to the new primary key" in page.inner_text(testid("regenerate-self-note"))
    assert save_dialog(page, "confirm-regenerate", "regenerate-dialog") == "ready"
    new = keys(hub, "iothubowner")
    assert new["primaryKey"] != old["primaryKey"] and new["secondaryKey"] == old["secondaryKey"]
    assert hub.policy_key("iothubowner") == new["primaryKey"]
    assert status(hub, "GET", "/devices/after-rekey", "iothubowner", old["primaryKey"]) == 401
    assert status(hub, "GET", "/devices/after-rekey", "iothubowner", new["primaryKey"]) == 200
    # The tab's session holds the new key, and the console goes on working with it.
    assert (stored_session(page) or {}).get("key") == new["primaryKey"], "the tab still holds a session with the new key"
    assert go(page, "devices") == "ready"
    page.wait_for_selector('tr[data-device-id="after-rekey"]')
    # Reloaded, the tab signs in from its session storage with the new key.
    page.reload()
    wait_state(page)
    assert go(page, "policies") == "ready"
    assert page.inner_text("#whoami") == "iothubowner"
    # The key not in use: regenerating it does not touch the session.
    page.click(testid("regenerate-secondary-iothubowner"))
    page.wait_for_selector(testid("regenerate-dialog"))
    assert page.locator(testid("regenerate-self-note")).count() == 0
    assert save_dialog(page, "confirm-regenerate", "regenerate-dialog") == "ready"
    assert keys(hub, "iothubowner")["secondaryKey"] != old["secondaryKey"]
    assert (stored_session(page) or {}).get("key") == new["primaryKey"], "the tab still holds a session with the new key"
    assert go(page, "devices") == "ready"
    errors.assert_none()


def test_removing_the_signed_in_policy_signs_out(hub, page):
    errors = ConsoleErrors(page)
    r = hub.request("PUT", "/console/api/policies/admin2", hub.token("iothubowner"), json={"rights": ALL})
    assert r.status_code == 200, r.text
    admin2 = keys(hub, "admin2")["primaryKey"]
    sign_in(page, hub, connection_string=f"HostName=localhost:{hub.port};SharedAccessKeyName=admin2;SharedAccessKey={admin2}")
    assert go(page, "policies") == "ready"
    assert page.locator('[data-policy="admin2"] .badge-info').inner_text() == "signed in"
    page.click(testid("remove-policy-admin2"))
    page.wait_for_selector(testid("remove-dialog"))
    assert "signed out" in page.inner_text(testid("remove-self-warning"))
    assert page.inner_text(testid("confirm-remove")) == "Remove and sign out"
    page.click(testid("confirm-remove"))
    page.wait_for_selector("textarea#connection-string")
    assert page.evaluate("() => location.hash") == "#/signin"
    assert stored_session(page) is None
    assert "admin2" not in listed(hub)
    assert status(hub, "GET", "/statistics/devices", "admin2", admin2) == 401
    errors.assert_none()


def test_the_signed_in_policy_losing_a_right_disables_the_buttons(hub, page):
    errors = ConsoleErrors(page)
    # Another policy keeps all four rights, so iothubowner may lose one.
    r = hub.request("PUT", "/console/api/policies/keeper", hub.token("iothubowner"), json={"rights": ALL})
    assert r.status_code == 200, r.text
    sign_in(page, hub)
    assert go(page, "policies") == "ready"
    assert page.locator(testid("add-policy")).is_enabled()
    page.click(testid("edit-policy-iothubowner"))
    page.wait_for_selector(testid("edit-self-note"))
    page.uncheck(testid("policy-right-DeviceConnect"))
    assert save_dialog(page) == "ready"
    assert listed(hub)["iothubowner"] == "RegistryRead, RegistryWrite, ServiceConnect"
    assert rights_shown(page, "iothubowner") == ["RegistryRead", "RegistryWrite", "ServiceConnect"]
    # The page was drawn again with the session's new rights.
    for b in ("add-policy", "edit-policy-keeper", "remove-policy-keeper", "show-keys-keeper"):
        loc = page.locator(testid(b))
        assert loc.is_disabled(), b
        assert "DeviceConnect" in (loc.get_attribute("title") or ""), b
    errors.assert_none()


def test_a_policy_without_all_four_rights_cannot_change_policies(hub, chromium):
    # 7. registryRead: every change button disabled, naming the missing rights.
    page = new_page(chromium)
    try:
        errors = ConsoleErrors(page)
        errors.allow_status(401)
        sign_in(page, hub, policy="registryRead")
        assert go(page, "policies") == "ready"
        buttons = ["add-policy"] + [f"{b}-{p}" for p in ("iothubowner", "registryRead")
                                    for b in ("edit-policy", "regenerate-primary", "regenerate-secondary", "remove-policy")]
        for b in buttons:
            loc = page.locator(testid(b))
            assert loc.is_disabled(), b
            title = loc.get_attribute("title") or ""
            assert "Needs" in title and "RegistryWrite" in title and "DeviceConnect" in title, (b, title)
        # Forced anyway: the hub's 401 in the dialog, and nothing is added.
        before = listed(hub)
        page.evaluate("() => { document.querySelector('[data-testid=\"add-policy\"]').disabled = false; }")
        page.click(testid("add-policy"))
        page.fill(testid("policy-name"), "sneaky")
        page.check(testid("policy-right-DeviceConnect"))
        page.click(testid("policy-save"))
        assert dialog_error(page).startswith("401 ")
        page.click(testid("dialog-cancel"))
        assert listed(hub) == before
        errors.assert_none()
    finally:
        page.context.close()


# -- screenshots, phone, keyboard ---------------------------------------------------------------------

def test_policies_page_screenshots_phone_and_keyboard(hub, chromium):
    owner = hub.token("iothubowner")
    r = hub.request("PUT", "/console/api/policies/ops", owner, json={"rights": ["RegistryRead", "ServiceConnect"]})
    assert r.status_code == 200, r.text

    # 8. 1280x800: editing a policy's rights.
    page = new_page(chromium)
    try:
        errors = ConsoleErrors(page)
        sign_in(page, hub)
        assert go(page, "policies") == "ready"
        page.click(testid("edit-policy-ops"))
        page.wait_for_selector(testid("policy-dialog"))
        page.check(testid("policy-right-RegistryWrite"))
        shot(page, "policies-edit")
        page.keyboard.press("Escape")
        page.wait_for_selector(testid("policy-dialog"), state="detached")
        assert listed(hub)["ops"] == "RegistryRead, ServiceConnect"
        errors.assert_none()
    finally:
        page.context.close()

    # 390x844: fits, and a policy is added by keyboard alone.
    page = new_page(chromium, viewport=PHONE)
    try:
        errors = ConsoleErrors(page)
        sign_in(page, hub)
        assert go(page, "policies") == "ready"
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"policies is {width}px wide at {PHONE['width']}px"
        for b in ("edit-policy-ops", "regenerate-primary-ops", "regenerate-secondary-ops", "remove-policy-ops"):
            box = page.locator(testid(b)).bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], (b, box)
        shot(page, "policies-phone")

        page.focus(testid("add-policy"))
        page.keyboard.press("Enter")
        page.wait_for_selector(testid("policy-dialog"))
        assert page.evaluate("() => document.activeElement.dataset.testid") == "policy-name"
        page.keyboard.type("kb-made")
        page.keyboard.press("Tab")
        assert page.evaluate("() => document.activeElement.dataset.testid") == "policy-right-RegistryRead"
        page.keyboard.press("Space")
        for _ in range(5):  # the other rights, Cancel, Add policy
            page.keyboard.press("Tab")
            assert page.evaluate("() => !!document.activeElement.closest('dialog')")
        page.focus(testid("policy-name"))
        assert reloaded(page, lambda: page.keyboard.press("Enter")) == "ready"
        page.wait_for_selector('[data-policy="kb-made"]')
        assert listed(hub)["kb-made"] == "RegistryRead"
        errors.assert_none()
    finally:
        page.context.close()
