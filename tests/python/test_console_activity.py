"""The console's Activity page (issue 69, point 2; docs/console.md, "Activity") in a real headless
Chromium against a real hub on the SDKs' fixed ports: a device connected with the official
Python SDK sends 30 messages, and the page's device-messages chart counts exactly those 30 (its
`data-total`, read again from the hub's own `GET /console/api/history`), its connected-devices
chart shows the device, its PUBACK chart a p50; a new window is fetched again (the request and
the labels); the page refreshes itself while shown and stops asking once left; the `device`
policy gets a clear message and no request. Screenshots at 1280x800 and 390x844.

Run under `flock /tmp/ferrohub-fixed-ports.lock` or in a network namespace of its own (the
`sdk_hub` fixture binds 443/8883/5671)."""

import json
import os
import threading
import time
import urllib.parse

import pytest
from azure.iot.device import Message

from consolekit import PHONE, ConsoleErrors, browser, go, new_page, shot, sign_in, testid
from deliverykit import device, wait_for

# In a cluster behind HAProxy each node charts its own clients, and the page and the device may
# be served by different nodes: this module's counts hold for one hub.
pytestmark = pytest.mark.skipif(os.environ.get("FERROHUB_TEST_CLUSTER") == "1",
                                reason="each cluster node charts only what it served itself")

REFRESH_S = 10  # the page's refresh period (pages/activity.js REFRESH_MS)
SENT = 30


@pytest.fixture(scope="module")
def chromium():
    with browser() as b:
        yield b


def history_log(page) -> list[int]:
    """The `minutes` of every GET /console/api/history the page makes, in order, from now on."""
    asked: list[int] = []

    def on_request(request):
        url = urllib.parse.urlsplit(request.url)
        if url.path == "/console/api/history":
            asked.append(int(urllib.parse.parse_qs(url.query).get("minutes", ["0"])[0]))
    page.on("request", on_request)
    return asked


def wait_asked(page, asked: list[int], done, timeout: float) -> list[int]:
    """Waits until `done(asked)` holds. Playwright's sync API delivers the page's request events
    only while a call into it runs, so the wait is page.wait_for_timeout, never time.sleep."""
    deadline = time.time() + timeout
    while not done(asked):
        assert time.time() < deadline, f"timed out; history requests: {asked}"
        page.wait_for_timeout(200)
    return asked


def chart(name: str) -> str:
    return testid(f"chart-{name}")


def attr(page, selector: str, name: str):
    return page.get_attribute(selector, f"data-{name}")


def number(page, selector: str, name: str) -> float | None:
    v = attr(page, selector, name)
    return None if v is None else float(v)


def drawn(page, name: str) -> int:
    """How many lines and lone points the chart's SVG draws."""
    return page.eval_on_selector(chart(name), "c => c.querySelectorAll('svg .chart-line, svg .chart-point').length")


def shown_minutes(page) -> str | None:
    return attr(page, testid("activity-charts"), "minutes")


def test_activity_charts_what_an_sdk_device_did(sdk_hub, chromium):
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    asked = history_log(page)
    client = None
    try:
        sign_in(page, sdk_hub)
        assert page.is_visible("nav#main-nav a[href='#/activity']")
        page.click("nav#main-nav a[href='#/activity']")
        page.wait_for_selector(f"{chart('device-messages')}[data-state=empty], {chart('device-messages')}[data-state=ready]")
        assert page.get_attribute("main#page", "data-state") == "ready"
        assert page.get_attribute("nav#main-nav a[href='#/activity']", "aria-current") == "page"
        # The last hour by default; this module's hub is its own, so nothing was sent yet: the
        # quiet state says so.
        assert page.is_checked(testid("activity-window-60"))
        assert asked and asked[0] == 60
        assert shown_minutes(page) == "60"
        assert number(page, chart("device-messages"), "total") == 0
        assert attr(page, chart("device-messages"), "state") == "empty"
        assert page.inner_text(testid("chart-device-messages-summary")) == "No device messages in this window."
        assert number(page, chart("connected-devices"), "latest") == 0
        assert number(page, chart("puback"), "samples") == 0
        assert page.inner_text(testid("chart-puback-summary")).startswith("No PUBACKs in this window")

        client = device(sdk_hub, "activity-dev")
        for i in range(SENT):
            m = Message(json.dumps({"n": i}))
            m.content_type, m.content_encoding = "application/json", "utf-8"
            client.send_message(m)  # QoS 1: returns once the hub's PUBACK is in
        requests_then = len(asked)

        # The page refreshes itself (no click) and counts exactly those messages.
        total = wait_for(lambda: number(page, chart("device-messages"), "total"),
                         lambda t: t is not None and t >= SENT, timeout=REFRESH_S + 15)
        assert total == SENT
        assert len(asked) > requests_then and set(asked) == {60}
        # The hub's own answer holds the same count.
        r = sdk_hub.request("GET", "/console/api/history?minutes=60", sdk_hub.token("registryRead"))
        assert r.status_code == 200, r.text
        assert sum(p["deviceMessages"] for p in r.json()["points"]) == SENT
        assert attr(page, chart("device-messages"), "state") == "ready"
        assert page.inner_text(testid("chart-device-messages-headline")) == str(SENT)
        summary = page.inner_text(testid("chart-device-messages-summary"))
        assert summary.startswith(f"Device messages: {SENT} in the last hour, peak "), summary
        assert drawn(page, "device-messages") >= 1
        # The device is connected: the gauge's last point counts it.
        assert number(page, chart("connected-devices"), "latest") >= 1
        assert page.inner_text(testid("chart-connected-devices-summary")).startswith("Connected devices: ")
        # PUBACK latency: the p50 line has a value, below or at the p99's.
        p50 = page.locator(f"{testid('chart-puback-legend')} li[data-series=pubackP50Ms]")
        p99 = page.locator(f"{testid('chart-puback-legend')} li[data-series=pubackP99Ms]")
        assert number(page, chart("puback"), "samples") >= 1
        assert float(p50.get_attribute("data-peak")) > 0
        assert float(p50.get_attribute("data-latest")) <= float(p99.get_attribute("data-latest"))
        assert " ms" in page.inner_text(testid("chart-puback-headline"))
        assert drawn(page, "puback") >= 1
        # Quiet charts still say why they are flat.
        assert page.inner_text(testid("chart-method-calls-summary")) == "No direct method calls in this window."
        assert attr(page, chart("method-calls"), "state") == "empty"

        # By keyboard: the plot takes focus and the arrow keys read the samples out.
        plot = page.locator(f"{chart('device-messages')} .chart-plot")
        plot.focus()
        page.keyboard.press("End")
        readout = testid("chart-device-messages-readout")
        last = int(attr(page, readout, "index"))
        assert "Device messages" in page.inner_text(readout)
        page.keyboard.press("ArrowLeft")
        assert int(attr(page, readout, "index")) == last - 1

        # A window chosen by keyboard (the arrow keys move between the radios) is fetched.
        n = len(asked)
        page.focus(testid("activity-window-60"))
        page.keyboard.press("ArrowLeft")
        assert page.is_checked(testid("activity-window-30"))
        wait_asked(page, asked, lambda a: 30 in a[n:], timeout=10)
        page.wait_for_function("() => document.querySelector('[data-testid=activity-charts]').dataset.minutes === '30'")
        # And by pointer: the request, the charts' window and their text follow.
        n = len(asked)
        page.click(f"{testid('activity-window')} label:has({testid('activity-window-5')})")
        wait_asked(page, asked, lambda a: 5 in a[n:], timeout=10)
        page.wait_for_function("() => document.querySelector('[data-testid=activity-charts]').dataset.minutes === '5'")
        assert page.inner_text(testid("chart-device-messages-summary")).startswith(f"Device messages: {SENT} in the last 5 minutes")
        assert page.inner_text(testid("activity-updated")).startswith("The last 5 minutes · updated ")
        assert number(page, chart("device-messages"), "total") == SENT

        # Traffic for the screenshot, counted by no assertion below: messages at a varying rate
        # and twin reads, while the page refreshes twice.
        stop = threading.Event()

        def traffic():
            i = 0
            while not stop.is_set():
                for _ in range(1 + i % 7):
                    client.send_message(Message(json.dumps({"background": i})))
                if i % 4 == 0:
                    client.get_twin()
                i += 1
                stop.wait(0.4)
        sender = threading.Thread(target=traffic, name="activity-traffic", daemon=True)
        sender.start()
        try:
            # While shown, the page asks again on its own every 10 s.
            n = len(asked)
            wait_asked(page, asked, lambda a: len(a) > n, timeout=REFRESH_S + 10)
            wait_asked(page, asked, lambda a: len(a) > n + 1, timeout=REFRESH_S + 10)
            assert asked[n:] == [5, 5]
        finally:
            stop.set()
            sender.join(20)
        assert not sender.is_alive()
        # Pointing at a chart reads out its nearest sample, and only while it points.
        assert page.inner_text(readout) == ""
        box = page.locator(f"{chart('device-messages')} svg").bounding_box()
        page.mouse.move(box["x"] + box["width"] - 14, box["y"] + box["height"] / 2)
        assert "Device messages" in page.inner_text(readout)
        page.mouse.move(0, 0)
        assert page.inner_text(readout) == ""
        shot(page, "activity")
        # Once left, the page never asks again: nothing in one and a half periods (an observation
        # window, in which the page's request events are delivered as they happen).
        assert go(page, "overview") == "ready"
        n = len(asked)
        page.wait_for_timeout(REFRESH_S * 1500)
        page.evaluate("() => 0")  # one more round trip: any request made by now has been reported
        assert asked[n:] == [], asked[n:]
        errors.assert_none()
    finally:
        page.context.close()
        if client is not None:
            client.shutdown()


def test_activity_on_a_phone(sdk_hub, chromium):
    """At 390 px the charts stack, each as wide as the screen (its viewBox follows the width),
    and nothing scrolls sideways. A device is connected, so the gauge shows it."""
    client = device(sdk_hub, "activity-phone")
    page = new_page(chromium, viewport=PHONE)
    errors = ConsoleErrors(page)
    try:
        client.send_message(Message("from a phone test"))
        sign_in(page, sdk_hub)
        assert go(page, "activity") == "ready"
        page.click(f"{testid('activity-window')} label:has({testid('activity-window-5')})")
        page.wait_for_function("() => document.querySelector('[data-testid=activity-charts]').dataset.minutes === '5'")
        assert number(page, chart("connected-devices"), "latest") >= 1
        assert number(page, chart("device-messages"), "total") >= 1
        layout = page.evaluate("""() => {
            const boxes = [...document.querySelectorAll('[data-testid=activity-charts] > .chart')].map((c) => c.getBoundingClientRect());
            const svgs = [...document.querySelectorAll('[data-testid=activity-charts] svg')];
            return {
                overflow: document.documentElement.scrollWidth - window.innerWidth,
                lefts: [...new Set(boxes.map((b) => Math.round(b.left)))],
                stacked: boxes.every((b, i) => i === 0 || b.top >= boxes[i - 1].bottom),
                widest: Math.max(...boxes.map((b) => b.right)),
                viewBoxes: svgs.map((s) => s.viewBox.baseVal.width),
                charts: boxes.length,
            };
        }""")
        assert layout["charts"] == 8, layout
        assert layout["overflow"] <= 0, layout
        assert len(layout["lefts"]) == 1 and layout["stacked"], layout
        assert layout["widest"] <= PHONE["width"], layout
        assert all(0 < w <= PHONE["width"] for w in layout["viewBoxes"]), layout
        shot(page, "activity-phone")
        errors.assert_none()
    finally:
        page.context.close()
        client.shutdown()


def test_device_policy_gets_a_clear_message_and_asks_nothing(sdk_hub, chromium):
    page = new_page(chromium)
    errors = ConsoleErrors(page)
    errors.allow_status(401)  # the overview, where sign-in lands, is refused what it asks
    asked = history_log(page)
    try:
        sign_in(page, sdk_hub, policy="device")
        assert go(page, "activity", states=("ready", "empty", "error")) == "empty"
        message = page.inner_text(testid("activity-denied"))
        assert "Activity needs RegistryRead or ServiceConnect" in message, message
        assert "The policy device has DeviceConnect" in message, message
        assert page.locator(".chart").count() == 0
        assert asked == []
        # The page's word is the hub's: the same policy is refused there.
        r = sdk_hub.request("GET", "/console/api/history", sdk_hub.token("device"))
        assert r.status_code == 401, r.text
        errors.assert_none()
    finally:
        page.context.close()
