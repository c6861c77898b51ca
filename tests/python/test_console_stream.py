"""The console's hub-wide live view (issue 69, point 3; docs/console.md, "Live events") in a real
headless Chromium against a real hub: two devices connected with the official Python SDK send
telemetry, a route sends connection events to `events` (as an IoT Hub user does to see them in
`az iot hub monitor-events`), and the page shows both devices' messages and their connection
events; the device filter keeps one device's; a pause holds new events back and a resume shows
them (nothing missed); the download is JSON lines of what is shown. Every expectation is the
hub's own: the messages the SDK sent, and the read API's view of them."""

import base64
import json
import time
from pathlib import Path

import pytest
from azure.iot.device import Message

from consolekit import DESKTOP, PHONE, ConsoleErrors, browser, go, new_page, shot, sign_in, testid
from deliverykit import device, wait_for


@pytest.fixture(scope="module")
def chromium():
    with browser() as b:
        yield b


def send(client, tag: str, n: int):
    m = Message(json.dumps({"from": tag, "n": n}))
    m.content_type, m.content_encoding = "application/json", "utf-8"
    client.send_message(m)


def shown(page) -> list[dict]:
    """What each event card shows: the sending device, its source (when not telemetry), the body."""
    return page.eval_on_selector_all("[data-testid=stream-event]", """els => els.map(e => ({
        device: e.querySelector('[data-testid=event-device]')?.innerText ?? null,
        source: e.querySelector('[data-testid=event-source]')?.innerText ?? 'Telemetry',
        body: e.querySelector('[data-testid=tail-body]').innerText}))""")


def bodies(page, device_id: str) -> list[int]:
    return sorted(json.loads(e["body"])["n"] for e in shown(page)
                  if e["device"] == device_id and e["source"] == "Telemetry")


def held(hub, device_id: str) -> list[dict]:
    """The device's telemetry as the hub's read API holds it."""
    return [json.loads(base64.b64decode(e["body"])) for e in hub.events_of(device_id)
            if e["systemProperties"].get("iothub-message-source", "Telemetry") == "Telemetry"]


def test_live_events_show_every_devices_messages_and_connection_events(sdk_hub, chromium):
    route = {"source": "DeviceConnectionStateEvents", "condition": "true", "endpointNames": ["events"]}
    r = sdk_hub.request("PUT", "/routing/routes/connections-to-events", sdk_hub.token(), json=route)
    assert r.status_code == 200, r.text
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    clients = []
    try:
        sign_in(page, sdk_hub)
        assert go(page, "stream") == "ready"
        page.wait_for_selector(f"{testid('stream-status')}:has-text('Listening')")
        a, b = device(sdk_hub, "live-a"), device(sdk_hub, "live-b")
        clients += [a, b]
        send(a, "a", 0)
        send(b, "b", 0)
        wait_for(lambda: (bodies(page, "live-a"), bodies(page, "live-b")), lambda v: v == ([0], [0]))
        connected = wait_for(lambda: {e["device"] for e in shown(page) if e["source"] == "deviceConnectionStateEvents"},
                             lambda d: d == {"live-a", "live-b"})
        assert connected == {"live-a", "live-b"}
        # What the page shows is what the hub holds: the read API has the same two messages.
        assert held(sdk_hub, "live-a") == [{"from": "a", "n": 0}]
        assert held(sdk_hub, "live-b") == [{"from": "b", "n": 0}]
        shot(page, "stream")
        # At phone width the page reflows: nothing scrolls sideways.
        page.set_viewport_size(PHONE)
        page.wait_for_function("() => document.documentElement.scrollWidth <= window.innerWidth")
        shot(page, "stream-phone")
        page.set_viewport_size(DESKTOP)

        # The device filter: from now on only live-b's events.
        page.fill(testid("stream-device"), "live-b")
        page.press(testid("stream-device"), "Enter")
        page.click(testid("stream-clear"))
        page.wait_for_selector(f"{testid('stream-status')}:has-text('live-b')")
        send(a, "a", 1)
        send(b, "b", 1)
        wait_for(lambda: bodies(page, "live-b"), lambda v: v == [1])
        assert {e["device"] for e in shown(page)} == {"live-b"}

        # Paused, a new message is not shown; resumed, it is (the cursor kept its place).
        page.click(testid("stream-toggle"))
        page.wait_for_selector(f"{testid('stream-toggle')}:has-text('Resume')")
        send(b, "b", 2)
        wait_for(lambda: held(sdk_hub, "live-b"), lambda m: len(m) == 3)  # stored: 0, 1, 2
        time.sleep(1)  # a running view would have shown it by now
        assert bodies(page, "live-b") == [1]
        page.click(testid("stream-toggle"))
        wait_for(lambda: bodies(page, "live-b"), lambda v: v == [1, 2])

        # The download: JSON lines of what is shown.
        with page.expect_download() as download:
            page.click(testid("stream-download"))
        lines = Path(download.value.path()).read_text().splitlines()
        saved = [json.loads(line) for line in lines]
        assert [(s["systemProperties"]["iothub-connection-device-id"], s["body"]) for s in saved] == \
            [("live-b", {"from": "b", "n": 1}), ("live-b", {"from": "b", "n": 2})]
        errors.assert_none()
    finally:
        for c in clients:
            c.shutdown()
        sdk_hub.request("DELETE", "/routing/routes/connections-to-events", sdk_hub.token())
        page.context.close()
