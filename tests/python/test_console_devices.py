"""The console's Devices page (issue 69): the plain search (device id prefix, status, connection
state, one tag) turned into a twin query the hub runs, the query shown in the query box for
experts, the Tags column, ids of any length at 1280 px and on a phone, and the search driven
from the keyboard. A real hub on the SDKs' fixed ports, a device connected with the official
Python device SDK, and every answer checked against the hub's own `POST /devices/query`.

Run under `flock /tmp/ferrohub-fixed-ports.lock` or in a network namespace of its own (the
`sdk_hub` fixture binds 443/8883/5671)."""

import time

import pytest
from azure.iot.device import IoTHubDeviceClient

from consolekit import PHONE, ConsoleErrors, browser, go, new_page, shot, sign_in, testid, wait_state

LONG_ID = "long-" + "x" * 118 + "-tail"  # 128 characters, the most IoT Hub allows
# id -> (status, tags); "lab-001" is connected by the SDK.
FLEET = {
    "lab-001": ("enabled", {"site": "lab", "floor": 2}),
    "lab-002": ("enabled", {"site": "lab", "share": "\\\\nas\\lab"}),
    "lab-003": ("disabled", {"site": "o'brien's"}),
    "yard-001": ("enabled", {"site": "yard", "location": {"building": "B 7"}, "rack-pos": "A1"}),
    "o'neil-1": ("enabled", {"owner": "o'neil", "floor": "2"}),
    LONG_ID: ("enabled", {"site": "far", "note": "a long note " * 20}),
}


@pytest.fixture(scope="module")
def chromium():
    with browser() as b:
        yield b


@pytest.fixture(scope="module")
def fleet(sdk_hub):
    """The devices above, tags set by twin PATCH, lab-001 connected over MQTT by the SDK."""
    for dev, (status, tags) in FLEET.items():
        sdk_hub.create_device(dev, status=status)
        sdk_hub.set_tags(dev, tags)
    client = IoTHubDeviceClient.create_from_connection_string(
        sdk_hub.device_connection_string("lab-001"), server_verification_cert=open(sdk_hub.ca).read())
    client.connect()
    deadline = time.time() + 20
    while hub_ids(sdk_hub, "SELECT * FROM devices WHERE connectionState = 'Connected'") != ["lab-001"]:
        assert time.time() < deadline, "lab-001 never showed as connected"
        time.sleep(0.2)
    yield sdk_hub
    client.shutdown()


@pytest.fixture
def page(chromium, fleet):
    p = new_page(chromium)
    errors = ConsoleErrors(p)
    sign_in(p, fleet)
    go(p, "devices")
    yield p
    errors.assert_none()
    p.context.close()


def hub_ids(hub, query):
    """The device ids the hub's own query API answers, sorted."""
    r = hub.request("POST", "/devices/query", hub.token(), json={"query": query})
    assert r.status_code == 200, (query, r.status_code, r.text)
    return sorted(t["deviceId"] for t in r.json())


def rows(page):
    return sorted(page.eval_on_selector_all("tr[data-testid=device-row]", "rs => rs.map(r => r.dataset.deviceId)"))


def submit_and_wait(page, action):
    """Runs `action` (which submits a search) and waits for the list it loads."""
    page.evaluate("() => { document.querySelector('main#page').dataset.state = 'loading'; }")
    action()
    return wait_state(page, ("ready", "empty", "error"))


def find(page, prefix="", status="", connection="", tag_name="", tag_value=""):
    """Fills the search form, presses Find and returns the listed ids (sorted)."""
    page.fill(testid("find-prefix"), prefix)
    page.select_option(testid("find-status"), status)
    page.select_option(testid("find-connection"), connection)
    page.fill(testid("find-tag-name"), tag_name)
    page.fill(testid("find-tag-value"), tag_value)
    assert submit_and_wait(page, lambda: page.click(testid("find"))) in ("ready", "empty")
    return rows(page)


def checked(page, hub, expected):
    """The ids listed are `expected`, and are what the hub answers to the query in the query box."""
    query = page.input_value(testid("device-query"))
    assert rows(page) == sorted(expected), query
    assert hub_ids(hub, query) == sorted(expected), query
    return query


def test_search_fields_become_the_hubs_twin_query(page, fleet):
    all_ids = sorted(FLEET)
    assert rows(page) == all_ids

    assert find(page, prefix="lab-") == ["lab-001", "lab-002", "lab-003"]
    assert checked(page, fleet, ["lab-001", "lab-002", "lab-003"]) == \
        "SELECT * FROM devices WHERE STARTSWITH(deviceId, 'lab-')"

    find(page, status="disabled")
    assert checked(page, fleet, ["lab-003"]) == "SELECT * FROM devices WHERE status = 'disabled'"
    find(page, prefix="lab-", status="enabled")
    checked(page, fleet, ["lab-001", "lab-002"])

    find(page, connection="Connected")
    assert checked(page, fleet, ["lab-001"]) == "SELECT * FROM devices WHERE connectionState = 'Connected'"
    find(page, prefix="lab-", connection="Disconnected")
    checked(page, fleet, ["lab-002", "lab-003"])

    find(page, tag_name="site", tag_value="lab")
    assert checked(page, fleet, ["lab-001", "lab-002"]) == "SELECT * FROM devices WHERE tags.site = 'lab'"
    # All four at once.
    find(page, prefix="lab-", status="enabled", connection="Disconnected", tag_name="site", tag_value="lab")
    assert checked(page, fleet, ["lab-002"]) == ("SELECT * FROM devices WHERE STARTSWITH(deviceId, 'lab-') "
                                                  "AND status = 'enabled' AND connectionState = 'Disconnected' "
                                                  "AND tags.site = 'lab'")
    assert find(page, prefix="lab-", status="disabled", connection="Connected") == []
    assert page.get_attribute("main#page", "data-state") == "empty"

    # Quotes in a value or a prefix are escaped the way the hub's lexer reads them.
    find(page, tag_name="site", tag_value="o'brien's")
    assert checked(page, fleet, ["lab-003"]) == "SELECT * FROM devices WHERE tags.site = 'o\\'brien\\'s'"
    find(page, prefix="o'n")
    checked(page, fleet, ["o'neil-1"])
    find(page, tag_name="share", tag_value="\\\\nas\\lab")
    assert checked(page, fleet, ["lab-002"]) == "SELECT * FROM devices WHERE tags.share = '\\\\\\\\nas\\\\lab'"
    # SQL's doubled quote is not the hub's escape: the hub refuses it (so the page never sends it).
    r = fleet.request("POST", "/devices/query", fleet.token(), json={"query": "SELECT * FROM devices WHERE tags.site = 'o''brien''s'"})
    assert r.status_code == 400, r.text
    # A dotted name is a nested tag; a name alone finds the twins that have the tag.
    find(page, tag_name="location.building", tag_value="B 7")
    checked(page, fleet, ["yard-001"])
    find(page, tag_name="rack-pos", tag_value="A1")
    assert checked(page, fleet, ["yard-001"]) == "SELECT * FROM devices WHERE tags.[[rack-pos]] = 'A1'"
    find(page, tag_name="owner")
    assert checked(page, fleet, ["o'neil-1"]) == "SELECT * FROM devices WHERE IS_DEFINED(tags.owner)"
    # A number matches the tag set as a number or as a string.
    find(page, tag_name="floor", tag_value="2")
    checked(page, fleet, ["lab-001", "o'neil-1"])

    # The query box holds the generated query: an expert refines it and presses Enter.
    find(page, prefix="lab-")
    page.fill(testid("device-query"), page.input_value(testid("device-query")) + " AND tags.floor = 2")
    submit_and_wait(page, lambda: page.press(testid("device-query"), "Enter"))
    checked(page, fleet, ["lab-001"])

    # What the form cannot write is refused in the page, and nothing is sent.
    before = page.input_value(testid("device-query"))
    page.fill(testid("find-tag-name"), "")
    page.fill(testid("find-tag-value"), "lab")
    page.click(testid("find"))
    assert "tag's name" in page.inner_text(testid("find-error"))
    page.fill(testid("find-tag-name"), "a]]b")
    page.click(testid("find"))
    assert "cannot be written" in page.inner_text(testid("find-error"))
    assert page.input_value(testid("device-query")) == before
    assert rows(page) == ["lab-001"]

    # The Tags column: "key: value" pairs, nested tags by their dotted path, all in the tooltip.
    assert submit_and_wait(page, lambda: page.click(testid("find-clear"))) == "ready"
    assert page.input_value(testid("device-query")) == "SELECT * FROM devices"
    assert rows(page) == all_ids
    cell = page.locator('tr[data-device-id="lab-001"] [data-testid=tags]')
    assert cell.inner_text() == "site: lab, floor: 2"
    assert cell.locator(".clip").get_attribute("title") == "site: lab\nfloor: 2"
    assert page.inner_text('tr[data-device-id="yard-001"] [data-testid=tags]') == "site: yard, location.building: B 7, rack-pos: A1"
    # The search is kept for the session: back on the page, the fields and the list are as left.
    find(page, prefix="lab-", status="enabled", tag_name="site", tag_value="lab")
    go(page, "overview")
    go(page, "devices")
    assert page.input_value(testid("find-prefix")) == "lab-"
    assert page.input_value(testid("find-status")) == "enabled"
    assert page.input_value(testid("find-tag-value")) == "lab"
    assert rows(page) == ["lab-001", "lab-002"]
    shot(page, "devices-search")


def overflow(page, selector):
    """[scrollWidth, clientWidth] of the element."""
    return page.eval_on_selector(selector, "e => [e.scrollWidth, e.clientWidth]")


def clipped(page, selector):
    """Whether the element hides some of its text (a clamped line overflows downwards)."""
    return page.eval_on_selector(selector, "e => e.scrollHeight > e.clientHeight || e.scrollWidth > e.clientWidth")


def test_a_128_character_id_fits_1280_px_and_a_phone(chromium, fleet):
    assert len(LONG_ID) == 128
    page = new_page(chromium)  # 1280x800
    errors = ConsoleErrors(page)
    sign_in(page, fleet)
    go(page, "devices")
    row = f'tr[data-device-id="{LONG_ID}"]'
    page.wait_for_selector(row)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    wide, shown = overflow(page, ".table-wrap")
    assert wide <= shown, "the table scrolls inside its frame at 1280 px"
    assert page.eval_on_selector(testid("devices-table"), "t => t.getBoundingClientRect().right") <= 1280
    shot(page, "devices-long-id")
    # The id is clipped, whole in its tooltip and in the text (selectable, and copied whole).
    link = f"{row} {testid('device-link')}"
    assert page.get_attribute(link, "title") == LONG_ID
    assert page.text_content(link) == LONG_ID
    assert clipped(page, link), "the long id is clipped"
    selected = page.eval_on_selector(link, """e => {
        const r = document.createRange(); r.selectNodeContents(e);
        getSelection().removeAllRanges(); getSelection().addRange(r);
        return getSelection().toString(); }""")
    assert selected == LONG_ID
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.click(f"{row} {testid('copy-id')}")
    page.wait_for_selector(f"{testid('toast')}:has-text('Copied')")
    assert page.evaluate("navigator.clipboard.readText()") == LONG_ID
    # A long tag list is clipped the same way.
    tags = f"{row} {testid('tags')} .clip"
    assert clipped(page, tags)
    assert "note: a long note" in page.get_attribute(tags, "title")
    errors.assert_none()
    page.context.close()

    phone = new_page(chromium, viewport=PHONE)
    errors = ConsoleErrors(phone)
    sign_in(phone, fleet)
    go(phone, "devices")
    phone.wait_for_selector(f'tr[data-device-id="{LONG_ID}"]')
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    wide, shown = overflow(phone, ".table-wrap")
    assert wide <= shown, "a card is wider than the phone"
    # On a card the whole id wraps onto more lines instead of being clipped.
    assert not clipped(phone, f'tr[data-device-id="{LONG_ID}"] {testid("device-link")}')
    phone.select_option(testid("find-status"), "enabled")
    phone.fill(testid("find-tag-name"), "site")
    phone.fill(testid("find-tag-value"), "far")
    submit_and_wait(phone, lambda: phone.click(testid("find")))
    assert rows(phone) == [LONG_ID]
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    shot(phone, "devices-search-phone", full_page=True)
    errors.assert_none()
    phone.context.close()


def test_the_search_is_driven_from_the_keyboard(page, fleet):
    # Every field has a visible label.
    for field, label in [("find-prefix", "Device id starts with"), ("find-status", "Status"),
                         ("find-connection", "Connection"), ("find-tag-name", "Tag name"),
                         ("find-tag-value", "Tag value")]:
        assert page.inner_text(f"label[for={field}]") == label
        assert page.is_visible(f"label[for={field}]")
    # Tab walks from the page's "New device" button through the form in order.
    page.focus(testid("new-device"))
    order = []
    for _ in range(8):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.id || document.activeElement.dataset.testid"))
    assert order == ["find-prefix", "find-status", "find-connection", "find-tag-name", "find-tag-value",
                     "find", "find-clear", "device-query"], order
    # Focus is visible on each field reached by the keyboard.
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Shift+Tab")
    assert page.evaluate("document.activeElement.id") == "find-tag-value"
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"
    # Enter in a text field runs the search.
    page.focus(testid("find-prefix"))
    page.keyboard.type("yard")
    assert submit_and_wait(page, lambda: page.keyboard.press("Enter")) == "ready"
    assert rows(page) == ["yard-001"]
    # So does Enter on a select: the prefix cleared, status moved to "Disabled" by arrow keys.
    page.fill(testid("find-prefix"), "")
    page.focus(testid("find-status"))
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    assert page.input_value(testid("find-status")) == "disabled"
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"
    assert submit_and_wait(page, lambda: page.keyboard.press("Enter")) == "ready"
    assert rows(page) == ["lab-003"]
    assert page.input_value(testid("device-query")) == "SELECT * FROM devices WHERE status = 'disabled'"
