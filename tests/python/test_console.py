"""The web console (issue 52) in headless Chromium against a real hub on the SDKs' fixed ports,
with the unmodified Python device SDK on the other side: sign in, create a device, connect it
with the connection string the console shows, edit its twin, watch its telemetry, call its
method, send it a C2D message; a wrong connection string, a read-only policy, sign-out, and the
REST API the SDKs use unchanged. Screenshots for docs/console.md are taken on the way.

Run under `flock /tmp/ferrohub-fixed-ports.lock` (the `sdk_hub` fixture binds 443/8883/5671)."""

import json
import threading
import time
import urllib.parse
import uuid

import pytest
import requests
from azure.iot.device import IoTHubDeviceClient, IoTHubModuleClient, Message, MethodResponse

from consolekit import (PHONE, ConsoleErrors, browser, console_url, go, new_page, shot, sign_in,
                        testid, wait_state)
from hubkit import parse_cs

WAIT = 20  # seconds for anything a device or the page should see


@pytest.fixture(scope="module")
def chromium():
    with browser() as b:
        yield b


def wait_for(pred, timeout=WAIT, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def device_client(hub, cs):
    return IoTHubDeviceClient.create_from_connection_string(cs, server_verification_cert=open(hub.ca).read())


def create_in_ui(page, device_id):
    page.click(testid("new-device"))
    page.fill(testid("new-id"), device_id)
    page.click(testid("create-submit"))
    page.wait_for_selector(testid("create-dialog"), state="detached")
    page.wait_for_selector(f'tr[data-device-id="{device_id}"]')


def open_device(page, device_id):
    go(page, f"devices/{urllib.parse.quote(device_id, safe='')}")
    page.wait_for_selector(testid("identity"))


def tab(page, name):
    page.click(testid(f"tab-{name}"))
    page.wait_for_selector(f'{testid(f"panel-{name}")}:not([hidden])')


# -- the console beside the REST API ----------------------------------------------------------

def test_console_is_served_beside_an_unchanged_rest_api(sdk_hub):
    base = f"https://localhost:{sdk_hub.port}"
    r = requests.get(f"{base}/console/", verify=sdk_hub.ca, timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), (r.status_code, r.headers)
    csp = r.headers.get("content-security-policy", "")
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, csp
    assert '<script type="module" src="/console/app.js">' in r.text
    js = requests.get(f"{base}/console/app.js", verify=sdk_hub.ca, timeout=10)
    assert js.status_code == 200 and "javascript" in js.headers["content-type"], js.headers
    assert requests.get(f"{base}/console/x", verify=sdk_hub.ca, timeout=10).status_code == 404
    assert requests.get(f"{base}/console/lib/nope.js", verify=sdk_hub.ca, timeout=10).status_code == 404
    # The console's own API needs a token like the rest.
    assert requests.get(f"{base}/console/api/session", verify=sdk_hub.ca, timeout=10).status_code == 401
    # The SDK-facing REST API answers JSON as before.
    sdk_hub.create_device("rest-unaffected")
    r = sdk_hub.request("GET", "/devices?top=10", sdk_hub.token())
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert any(d["deviceId"] == "rest-unaffected" for d in r.json())
    r = sdk_hub.request("GET", "/devices/rest-unaffected", None)
    assert r.status_code == 401 and "IotHubUnauthorizedAccess" in r.json()["Message"]


# -- sign-in ----------------------------------------------------------------------------------

def test_sign_in_refuses_wrong_strings_with_the_hubs_401(sdk_hub, chromium):
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    errors.allow_status(401)  # Chromium logs each refused fetch; the refusal is the point here
    page.goto(console_url(sdk_hub))
    page.wait_for_selector("textarea#connection-string")
    assert page.evaluate("location.hash") == "#/signin"
    shot(page, "signin")

    # A wrong key: the hub answers 401 and the page says so.
    cs = parse_cs(sdk_hub.connection_string())
    wrong = f"HostName={cs['HostName']};SharedAccessKeyName=iothubowner;SharedAccessKey={'A' * 43}="
    page.fill("#connection-string", wrong)
    page.click("#sign-in")
    page.wait_for_selector("#signin-error:has-text('401')")
    text = page.inner_text("#signin-error")
    assert "IotHubUnauthorizedAccess" in text, text
    assert page.evaluate("sessionStorage.getItem('ferrohub.console.session')") is None

    # An unknown policy: 401 as well.
    page.fill("#connection-string", f"HostName={cs['HostName']};SharedAccessKeyName=nosuch;SharedAccessKey={cs['SharedAccessKey']}")
    page.click("#sign-in")
    page.wait_for_function("() => document.querySelector('#signin-error').textContent.includes('401') && !document.querySelector('#sign-in').disabled")

    # A device connection string and garbage are refused before any request.
    page.fill("#connection-string", f"HostName=localhost;DeviceId=d1;SharedAccessKey={cs['SharedAccessKey']}")
    page.click("#sign-in")
    page.wait_for_selector("#signin-error:has-text('device connection string')")
    page.fill("#connection-string", "not a connection string")
    page.click("#sign-in")
    page.wait_for_selector("#signin-error:has-text('Name=value')")
    assert page.evaluate("location.hash") == "#/signin"
    errors.assert_none()
    page.context.close()


def test_sign_out_clears_the_session(sdk_hub, chromium):
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    sign_in(page, sdk_hub)
    assert page.inner_text("#whoami") == "iothubowner"
    stored = json.loads(page.evaluate("sessionStorage.getItem('ferrohub.console.session')"))
    assert stored["policyName"] == "iothubowner" and stored["key"]
    # A reload keeps the session (sessionStorage) and asks the hub who it is again.
    page.reload()
    page.wait_for_selector("#whoami")
    wait_state(page)
    assert page.evaluate("location.hash") == "#/overview"
    page.click("button#sign-out")
    page.wait_for_selector("textarea#connection-string")
    assert page.evaluate("location.hash") == "#/signin"
    assert page.evaluate("sessionStorage.length") == 0
    assert not page.is_visible("nav#main-nav")
    # Going back to a page needs a new sign-in.
    page.evaluate("location.hash = '#/devices'")
    page.wait_for_function("location.hash === '#/signin'")
    page.reload()
    page.wait_for_selector("textarea#connection-string")
    errors.assert_none()
    page.context.close()


# -- a device end to end ----------------------------------------------------------------------

def test_device_end_to_end_with_the_sdk(sdk_hub, chromium, tmp_path):
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    errors.allow_status(412)  # the stale-etag save below is refused on purpose
    sign_in(page, sdk_hub)

    # Overview: the hub's facts and counts.
    sdk_hub.create_device("overview-extra")
    go(page, "overview")
    page.wait_for_selector(f"{testid('hub-facts')}[data-state='ready']")
    page.wait_for_selector(f"{testid('traffic')}[data-state='ready']")
    total = sdk_hub.request("GET", "/statistics/devices", sdk_hub.token()).json()["totalDeviceCount"]
    page.wait_for_function("(n) => document.querySelector('[data-testid=devices-total]').textContent === String(n)", arg=total)
    assert "localhost" in page.inner_text(testid("hub-facts"))

    # Create a device in the UI; the REST API has it.
    dev = f"ui-{uuid.uuid4().hex[:6]}"
    go(page, "devices")
    create_in_ui(page, dev)
    r = sdk_hub.request("GET", f"/devices/{dev}", sdk_hub.token())
    assert r.status_code == 200 and r.json()["status"] == "enabled" and r.json()["authentication"]["type"] == "sas"

    # The connection string the UI shows connects the SDK device.
    page.click(f'tr[data-device-id="{dev}"] {testid("conn-string")}')
    cs = page.input_value(testid("conn-primary"))
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.click(testid("copy-conn-primary"))
    page.wait_for_selector(f"{testid('toast')}:has-text('Copied')")
    assert page.evaluate("navigator.clipboard.readText()") == cs
    page.keyboard.press("Escape")  # dialogs close on Escape
    page.wait_for_selector(testid("conn-dialog"), state="detached")
    key = r.json()["authentication"]["symmetricKey"]["primaryKey"]
    assert cs == f"HostName=localhost;DeviceId={dev};SharedAccessKey={key}", cs

    patches, c2d, lock = [], [], threading.Lock()
    client = device_client(sdk_hub, cs)

    def on_method(req):
        client.send_method_response(MethodResponse.create_from_method_request(
            req, 200, {"method": req.name, "echo": req.payload, "ok": True}))

    def on_patch(p):
        with lock:
            patches.append(p)

    def on_message(m):
        with lock:
            c2d.append(m)

    client.on_method_request_received = on_method
    client.on_twin_desired_properties_patch_received = on_patch
    client.on_message_received = on_message
    client.connect()
    try:
        # The device page sees it connected.
        open_device(page, dev)
        page.wait_for_selector(f"{testid('connection-state')}[data-state='Connected']", timeout=WAIT * 1000)

        # Twin: edit the desired properties; the SDK device gets the patch.
        tab(page, "twin")
        page.wait_for_selector(f"{testid('panel-twin')}[data-state='ready']")
        page.fill(testid("twin-desired"), json.dumps({"targetTemperature": 22.5, "mode": {"name": "eco", "level": 2}}, indent=2))
        page.fill(testid("twin-tags"), json.dumps({"site": "plant-3"}))
        page.click(testid("twin-save"))
        page.wait_for_selector(testid("twin-saved"))
        got = wait_for(lambda: next((p for p in list(patches) if p.get("targetTemperature") == 22.5), None), what="desired patch")
        assert got["mode"] == {"name": "eco", "level": 2}
        twin = sdk_hub.request("GET", f"/twins/{dev}", sdk_hub.token()).json()
        assert twin["tags"] == {"site": "plant-3"} and twin["properties"]["desired"]["targetTemperature"] == 22.5
        client.patch_twin_reported_properties({"firmware": "1.4.2", "temperature": 21.9})
        page.click(testid("twin-reload"))
        page.wait_for_function("() => document.querySelector('[data-testid=twin-reported]').value.includes('1.4.2')")
        # Invalid JSON is flagged and cannot be saved.
        page.fill(testid("twin-desired"), "{ nope")
        page.wait_for_selector(f"{testid('twin-desired')}.invalid")
        assert page.is_disabled(testid("twin-save"))
        page.fill(testid("twin-desired"), json.dumps({"targetTemperature": 22.5, "mode": {"name": "eco", "level": 2}}, indent=2))
        shot(page, "device-twin")
        # A stale etag: someone else changes the twin; saving shows the 412 and changes nothing.
        r = sdk_hub.request("PATCH", f"/twins/{dev}", sdk_hub.token(), json={"properties": {"desired": {"other": 1}}})
        assert r.status_code == 200
        page.fill(testid("twin-desired"), json.dumps({"targetTemperature": 30}))
        page.click(testid("twin-save"))
        page.wait_for_selector(f"{testid('twin-conflict')}:has-text('412')")
        twin = sdk_hub.request("GET", f"/twins/{dev}", sdk_hub.token()).json()
        assert twin["properties"]["desired"]["targetTemperature"] == 22.5 and twin["properties"]["desired"]["other"] == 1
        page.click(testid("twin-reload"))
        page.wait_for_function("() => document.querySelector('[data-testid=twin-desired]').value.includes('\"other\"')")

        # Telemetry: the SDK device's messages appear in the live tail with their properties.
        tab(page, "telemetry")
        page.wait_for_selector(f"{testid('tail-status')}:has-text('Listening')")
        for i in range(3):
            msg = Message(json.dumps({"temperature": 21.5 + i, "seq": i}), content_type="application/json", content_encoding="utf-8")
            msg.custom_properties["alpha"] = str(5 + i)
            msg.message_id = f"m-{i}"
            client.send_message(msg)
        page.wait_for_function("() => document.querySelectorAll('[data-testid=tail-event]').length >= 3", timeout=WAIT * 1000)
        newest = page.locator(testid("tail-event")).first
        assert json.loads(newest.locator(testid("tail-body")).inner_text()) == {"temperature": 23.5, "seq": 2}
        props = newest.locator(testid("tail-props")).inner_text()
        assert "alpha: 7" in props and "message-id: m-2" in props and "content-type: application/json" in props, props
        assert page.inner_text(testid("tail-count")) == "3 events"
        shot(page, "device-telemetry")
        # Download as JSON lines.
        with page.expect_download() as dl:
            page.click(testid("tail-download"))
        path = tmp_path / "tail.jsonl"
        dl.value.save_as(path)
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        assert [x["body"]["seq"] for x in lines] == [0, 1, 2]
        assert lines[0]["properties"] == {"alpha": "5"} and lines[0]["systemProperties"]["iothub-connection-device-id"] == dev
        # Pause: nothing new shows; resume: what came meanwhile shows; clear empties the list.
        page.click(testid("tail-toggle"))
        page.wait_for_selector(f"{testid('tail-toggle')}:has-text('Resume')")
        client.send_message(Message(json.dumps({"seq": 3})))
        time.sleep(1.0)
        assert page.locator(testid("tail-event")).count() == 3
        page.click(testid("tail-toggle"))
        page.wait_for_function("() => document.querySelectorAll('[data-testid=tail-event]').length === 4")
        page.click(testid("tail-clear"))
        assert page.locator(testid("tail-event")).count() == 0

        # Direct method: the SDK device answers; the page shows status and payload.
        tab(page, "method")
        page.fill(testid("method-name"), "reboot")
        page.fill(testid("method-payload"), json.dumps({"delay": 5}))
        page.fill(testid("method-response-timeout"), "10")
        page.click(testid("method-invoke"))
        page.wait_for_selector(testid("method-result"))
        assert page.inner_text(testid("method-result-status")).startswith("Status 200")
        payload = json.loads(page.inner_text(testid("method-result-payload")))
        assert payload == {"method": "reboot", "echo": {"delay": 5}, "ok": True}
        shot(page, "device-method")

        # C2D: body, properties and ack reach the SDK device.
        tab(page, "c2d")
        page.fill(testid("c2d-body"), "turn the fan on")
        page.click(testid("c2d-add-prop"))
        page.locator(testid("c2d-prop-name")).last.fill("priority")
        page.locator(testid("c2d-prop-value")).last.fill("high")
        page.fill(testid("c2d-message-id"), "ui-c2d-1")
        page.select_option(testid("c2d-ack"), "full")
        page.click(testid("c2d-send"))
        page.wait_for_selector(testid("c2d-sent"))
        m = wait_for(lambda: next((x for x in list(c2d) if x.message_id == "ui-c2d-1"), None), what="C2D message")
        assert m.data == b"turn the fan on"
        assert m.custom_properties.get("priority") == "high" and m.ack == "full", (m.custom_properties, m.ack)
        assert page.inner_text(testid("c2d-queue-depth")) in ("0", "1")

        # The devices list: disable and enable from the UI; the registry follows.
        go(page, "devices")
        page.click(f'tr[data-device-id="{dev}"] {testid("disable")}')
        wait_for(lambda: sdk_hub.request("GET", f"/devices/{dev}", sdk_hub.token()).json()["status"] == "disabled", what="disabled")
        page.wait_for_selector(f'tr[data-device-id="{dev}"] {testid("enable")}')
        page.click(f'tr[data-device-id="{dev}"] {testid("enable")}')
        wait_for(lambda: sdk_hub.request("GET", f"/devices/{dev}", sdk_hub.token()).json()["status"] == "enabled", what="enabled")
    finally:
        client.shutdown()

    # The twin query box filters (server-side paging with a page of 1 row).
    go(page, "devices")
    page.fill(testid("device-query"), f"SELECT * FROM devices WHERE tags.site = 'plant-3'")
    page.select_option(testid("page-size"), "10")
    page.click(testid("run-query"))
    page.wait_for_function("(d) => { const r = [...document.querySelectorAll('tr[data-testid=device-row]')]; return r.length === 1 && r[0].dataset.deviceId === d; }", arg=dev)

    # Delete from the UI, after confirming.
    page.fill(testid("device-query"), "SELECT * FROM devices")
    page.click(testid("run-query"))
    page.click(f'tr[data-device-id="{dev}"] {testid("delete")}')
    page.click(testid("confirm-delete"))
    page.wait_for_selector(f'tr[data-device-id="{dev}"]', state="detached")
    assert sdk_hub.request("GET", f"/devices/{dev}", sdk_hub.token()).status_code == 404
    errors.assert_none()
    page.context.close()


def test_devices_are_paged_by_the_hub(sdk_hub, chromium):
    for i in range(12):
        sdk_hub.create_device(f"page-{i:02d}", status="disabled" if i in (2, 5) else "enabled")
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    sign_in(page, sdk_hub)
    go(page, "devices")
    page.fill(testid("device-query"), "SELECT * FROM devices WHERE STARTSWITH(deviceId, 'page-')")
    page.select_option(testid("page-size"), "10")
    page.click(testid("run-query"))
    page.wait_for_function("() => document.querySelectorAll('tr[data-testid=device-row]').length === 10")
    first = page.eval_on_selector_all("tr[data-testid=device-row]", "rs => rs.map(r => r.dataset.deviceId)")
    page.click(testid("devices-pager-next"))
    page.wait_for_function("() => document.querySelectorAll('tr[data-testid=device-row]').length === 2")
    second = page.eval_on_selector_all("tr[data-testid=device-row]", "rs => rs.map(r => r.dataset.deviceId)")
    assert sorted(first + second) == [f"page-{i:02d}" for i in range(12)]
    assert page.is_disabled(testid("devices-pager-next"))
    page.click(testid("devices-pager-prev"))
    page.wait_for_function("() => document.querySelectorAll('tr[data-testid=device-row]').length === 10")
    # The "Disabled" example query.
    page.click("button:has-text('Disabled')")
    page.wait_for_function("() => [...document.querySelectorAll('tr[data-testid=device-row]')].map(r => r.dataset.deviceId).join() === 'page-02,page-05'")
    assert page.inner_text('tr[data-device-id="page-02"] .badge') == "disabled"
    assert page.locator('tr[data-device-id="page-02"]').locator(testid("enable")).count() == 1
    # A query that does not parse shows the hub's 400.
    errors.allow_status(400)
    page.fill(testid("device-query"), "SELECT * FROM nowhere")
    page.click(testid("run-query"))
    wait_state(page, ("error",))
    assert "400" in page.inner_text(".error-state")
    page.fill(testid("device-query"), "SELECT * FROM devices")
    page.click(testid("run-query"))
    wait_state(page)
    # A device that does not exist, and a page that does not exist: error states with the 404.
    errors.allow_status(404)
    assert go(page, "devices/no-such-device", states=("error",)) == "error"
    assert "404" in page.inner_text(".error-state") and "DeviceNotFound" in page.inner_text(".error-state")
    assert go(page, "no-such-page", states=("error",)) == "error"
    assert "404" in page.inner_text(".error-state")
    # The list at 1280x800 and on a phone.
    go(page, "devices")
    shot(page, "devices")
    errors.assert_none()
    page.context.close()

    phone = new_page(chromium, viewport=PHONE)
    errors = ConsoleErrors(phone)
    sign_in(phone, sdk_hub)
    assert not phone.is_visible("nav#main-nav a[href='#/devices']")
    phone.click("#nav-toggle")
    phone.click("nav#main-nav a[href='#/devices']")
    wait_state(phone)
    assert not phone.is_visible("nav#main-nav a[href='#/devices']")
    phone.wait_for_selector("tr[data-testid=device-row]")
    # Nothing wider than the screen but the table, which scrolls inside its frame.
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    shot(phone, "devices-phone")
    errors.assert_none()
    phone.context.close()


def test_overview_shows_live_rates(sdk_hub, chromium):
    sdk_hub.create_device("ov-sensor")
    client = device_client(sdk_hub, sdk_hub.device_connection_string("ov-sensor"))
    client.connect()
    stop = threading.Event()

    def send():
        i = 0
        while not stop.is_set():
            client.send_message(Message(json.dumps({"i": i})))
            i += 1
            time.sleep(0.1)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    try:
        sign_in(page, sdk_hub)
        page.wait_for_selector(f"{testid('partitions')}[data-state='ready']")
        # Rates come from two metrics samples: messages flow, so the rate is above zero.
        page.wait_for_function(r"""() => {
            const t = document.querySelector('[data-testid=rate-d2c-detail]')?.textContent || '';
            return /^[0-9.]+\/s$/.test(t) && parseFloat(t) > 0;
        }""")
        page.wait_for_function("() => /p50 .* p99/.test(document.querySelector('[data-testid=lat-d2c]').textContent)")
        page.wait_for_function("() => Number(document.querySelector('[data-testid=devices-connected]').textContent) >= 1", timeout=15_000)
        retained = page.eval_on_selector_all(f"{testid('partitions-table')} tbody tr",
                                             "rs => rs.map(r => Number(r.children[1].textContent.replace(/,/g, '')))")
        assert len(retained) == len(sdk_hub.partitions()) and sum(retained) > 0, retained
        # The CA certificate link downloads the hub's CA, as the browser saves it.
        with page.expect_download() as download:
            page.click(testid("ca-download"))
        assert download.value.suggested_filename == "ferrohub-ca.pem"
        assert open(download.value.path(), "rb").read() == open(sdk_hub.ca, "rb").read()
        shot(page, "overview")
    finally:
        stop.set()
        sender.join(5)
        client.shutdown()
    errors.assert_none()
    page.context.close()


def test_plug_and_play_model_components_and_command(sdk_hub, chromium):
    model = "dtmi:com:example:TemperatureController;1"
    sdk_hub.create_device("pnp-ui")
    client = IoTHubDeviceClient.create_from_connection_string(
        sdk_hub.device_connection_string("pnp-ui"), server_verification_cert=open(sdk_hub.ca).read(), product_info=model)

    def on_method(req):
        answer = (201, {"maxTemp": 30.5, "since": req.payload}) if req.name == "thermostat1*getMaxMinReport" else (404, {"unknown": req.name})
        client.send_method_response(MethodResponse.create_from_method_request(req, *answer))

    client.on_method_request_received = on_method
    client.connect()
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    try:
        client.patch_twin_reported_properties({"serialNumber": "sn-1", "thermostat1": {"__t": "c", "maxTempSinceLastReboot": 25.3}})
        sign_in(page, sdk_hub)
        open_device(page, "pnp-ui")
        tab(page, "pnp")
        page.wait_for_selector(f"{testid('panel-pnp')}[data-state='ready']")
        assert page.inner_text(testid("pnp-model-id")) == model
        assert page.locator(testid("pnp-component-card")).count() == 1
        assert "maxTempSinceLastReboot" in page.inner_text(testid("pnp-component-card"))
        page.select_option(testid("pnp-component"), "thermostat1")
        page.fill(testid("pnp-command"), "getMaxMinReport")
        page.fill(testid("pnp-payload"), json.dumps("2026-11-01T00:00:00Z"))
        page.click(testid("pnp-invoke"))
        page.wait_for_selector(testid("pnp-result"))
        assert page.inner_text(testid("pnp-result-status")) == "Status 201"
        assert json.loads(page.inner_text(testid("pnp-result-payload"))) == {"maxTemp": 30.5, "since": "2026-11-01T00:00:00Z"}
        # The devices list's Plug and Play filter finds it.
        go(page, "devices")
        page.fill(testid("device-query"), "SELECT * FROM devices WHERE modelId = '" + model + "'")
        page.click(testid("run-query"))
        page.wait_for_function("() => [...document.querySelectorAll('tr[data-testid=device-row]')].map(r => r.dataset.deviceId).join() === 'pnp-ui'")
    finally:
        client.shutdown()
    errors.assert_none()
    page.context.close()


def test_module_page_twin_telemetry_and_method(sdk_hub, chromium):
    sdk_hub.create_device("mod-host")
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    sign_in(page, sdk_hub)
    open_device(page, "mod-host")
    tab(page, "modules")
    page.click(testid("new-module"))
    page.fill(testid("new-id"), "filter")
    page.keyboard.press("Enter")  # Enter runs the dialog's primary action
    page.wait_for_selector(f"{testid('module-row')} a:has-text('filter')")
    assert sdk_hub.request("GET", "/devices/mod-host/modules/filter", sdk_hub.token()).status_code == 200
    page.click(testid("module-conn-string"))
    cs = page.input_value(testid("conn-primary"))
    assert ";ModuleId=filter;" in cs
    page.click(testid("conn-close"))
    patches = []
    client = IoTHubModuleClient.create_from_connection_string(cs, server_verification_cert=open(sdk_hub.ca).read())
    client.on_twin_desired_properties_patch_received = patches.append
    client.on_method_request_received = lambda req: client.send_method_response(
        MethodResponse.create_from_method_request(req, 200, {"module": "filter", "got": req.payload}))
    client.connect()
    try:
        page.click(f"{testid('module-row')} a:has-text('filter')")
        page.wait_for_function("location.hash === '#/devices/mod-host/modules/filter'")
        # The device page stays "ready" until the module page replaces it: wait for the
        # module's own tabs (the device's are six), not for a state the old page already had.
        page.wait_for_function(
            "() => [...document.querySelectorAll('[role=tab]')].map(t => t.dataset.testid).join() === "
            "'tab-twin,tab-telemetry,tab-method'", timeout=20_000)
        wait_state(page)
        page.wait_for_selector(f"{testid('connection-state')}[data-state='Connected']", timeout=WAIT * 1000)
        # Tabs move with the arrow keys.
        page.focus(testid("tab-twin"))
        page.keyboard.press("ArrowRight")
        assert page.get_attribute(testid("tab-telemetry"), "aria-selected") == "true"
        page.wait_for_selector(f"{testid('tail-status')}:has-text('Listening')")
        msg = Message(json.dumps({"filtered": True}))
        msg.custom_properties["stage"] = "filter"
        client.send_message(msg)
        page.wait_for_selector(f"{testid('tail-event')}:has-text('module filter')")
        assert "stage: filter" in page.inner_text(testid("tail-props"))
        tab(page, "twin")
        page.wait_for_selector(f"{testid('panel-twin')}[data-state='ready']")
        page.fill(testid("twin-desired"), json.dumps({"threshold": 7}))
        page.click(testid("twin-save"))
        page.wait_for_selector(testid("twin-saved"))
        wait_for(lambda: any(p.get("threshold") == 7 for p in patches), what="module desired patch")
        tab(page, "method")
        page.fill(testid("method-name"), "flush")
        page.fill(testid("method-payload"), "[1, 2]")
        page.click(testid("method-invoke"))
        page.wait_for_selector(testid("method-result"))
        assert json.loads(page.inner_text(testid("method-result-payload"))) == {"module": "filter", "got": [1, 2]}
    finally:
        client.shutdown()
    errors.assert_none()
    page.context.close()


# -- a read-only policy -----------------------------------------------------------------------

def test_read_only_policy_has_write_buttons_disabled_and_forced_calls_get_401(sdk_hub, chromium):
    sdk_hub.create_device("ro-dev")
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    errors.allow_status(401)  # the forced calls below
    sign_in(page, sdk_hub, policy="registryRead")
    assert page.inner_text("#whoami") == "registryRead"
    go(page, "devices")
    page.wait_for_selector('tr[data-device-id="ro-dev"]')
    new = page.locator(testid("new-device"))
    assert new.is_disabled() and "RegistryWrite" in new.get_attribute("title")
    row = page.locator('tr[data-device-id="ro-dev"]')
    for action in ("disable", "delete"):
        assert row.locator(testid(action)).is_disabled()
    assert not row.locator(testid("conn-string")).is_disabled()  # RegistryRead may read keys

    open_device(page, "ro-dev")
    for button in ("toggle-status", "regen", "delete"):
        assert page.is_disabled(testid(button)), button
    tab(page, "twin")
    page.wait_for_selector(f"{testid('panel-twin')}[data-state='ready']")
    assert page.is_disabled(testid("twin-save"))
    assert "ServiceConnect" in page.get_attribute(testid("twin-save"), "title")
    tab(page, "method")
    assert page.is_disabled(testid("method-invoke"))
    tab(page, "telemetry")
    assert page.is_disabled(testid("tail-toggle"))

    # Forced through the UI: the disabled button enabled by hand, the hub says 401 and the
    # dialog shows it.
    go(page, "devices")
    page.evaluate("() => { const b = document.querySelector('[data-testid=new-device]'); b.disabled = false; }")
    page.click(testid("new-device"))
    page.fill(testid("new-id"), "ro-forced")
    page.click(testid("create-submit"))
    page.wait_for_selector(".dialog-error:has-text('401')")
    assert "IotHubUnauthorizedAccess" in page.inner_text(".dialog-error")
    page.click(testid("create-cancel"))
    assert sdk_hub.request("GET", "/devices/ro-forced", sdk_hub.token()).status_code == 404

    # Forced through the api module: a write and a ServiceConnect call are refused.
    statuses = page.evaluate("""async () => {
        const { createApi } = await import('/console/lib/api.js');
        const { load } = await import('/console/lib/session.js');
        const api = createApi(load());
        const out = [];
        for (const call of [
            () => api.put('/devices/ro-forced2', { deviceId: 'ro-forced2' }),
            () => api.del('/devices/ro-dev', { ifMatch: '*' }),
            () => api.post('/twins/ro-dev/methods', { methodName: 'x' }),
        ]) {
            try { await call(); out.push(200); } catch (e) { out.push([e.status, e.code]); }
        }
        return out;
    }""")
    assert statuses == [[401, "IotHubUnauthorizedAccess"]] * 3, statuses
    assert sdk_hub.request("GET", "/devices/ro-dev", sdk_hub.token()).status_code == 200
    errors.assert_none()
    page.context.close()


def test_service_policy_works_devices_through_their_twins(sdk_hub, chromium):
    """`service` (ServiceConnect only) cannot read identities or change the registry, but can
    list devices by query, read and edit twins, tail telemetry and call methods."""
    sdk_hub.create_device("svc-dev")
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    sign_in(page, sdk_hub, policy="service")
    assert page.inner_text(testid("devices-total")) == "—"
    go(page, "devices")
    page.wait_for_selector('tr[data-device-id="svc-dev"]')
    assert page.is_disabled(testid("new-device"))
    assert page.locator('tr[data-device-id="svc-dev"]').locator(testid("conn-string")).is_disabled()
    open_device(page, "svc-dev")
    assert "disconnected" in page.inner_text(testid("identity"))
    assert page.is_disabled(testid("delete")) and page.is_disabled(testid("conn-string"))
    tab(page, "twin")
    page.wait_for_selector(f"{testid('panel-twin')}[data-state='ready']")
    page.fill(testid("twin-tags"), json.dumps({"owner": "ops"}))
    page.click(testid("twin-save"))
    page.wait_for_selector(testid("twin-saved"))
    assert sdk_hub.request("GET", "/twins/svc-dev", sdk_hub.token()).json()["tags"] == {"owner": "ops"}
    tab(page, "method")
    assert not page.is_disabled(testid("method-invoke"))
    errors.assert_none()
    page.context.close()
