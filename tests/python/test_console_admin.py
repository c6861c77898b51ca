"""The web console's admin pages (issue 52) in a real headless Chromium against a real hub:
routing (a route made in the UI routes telemetry sent through the device REST endpoint; an
enrichment; the fallback switch; the route test box), scheduled jobs (a twin update job made in
the UI changes the twins it selects; a job scheduled for later is cancelled), configurations
(created in the UI, applied by the hub, deleted), certificate authorities, shared access
policies (keys only on request; a read-only policy is refused with 401), and the pages at a
phone's size. Every effect is read back through the hub's REST and read APIs."""

import base64
import time
import urllib.parse

import pytest

import certs
from consolekit import PHONE, ConsoleErrors, browser, go, new_page, shot, sign_in, testid, wait_state
from routingkit import get_routing, put_endpoint, put_route, read_endpoint, send_http, wait_count

@pytest.fixture(scope="module")
def chromium():
    with browser() as b:
        yield b


@pytest.fixture
def page(chromium):
    p = new_page(chromium)
    yield p
    p.context.close()


def rest(hub, method, path, policy="iothubowner", **kw):
    return hub.request(method, path, hub.token(policy), **kw)


def eventually(check, timeout=20.0, interval=0.2):
    """Calls check() until it stops raising AssertionError (or the timeout); returns its value."""
    deadline = time.time() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.time() > deadline:
                raise
            time.sleep(interval)


def page_shot(page, name):
    """A 1280x800 screenshot of the page from its top (docs/console/{name}.png)."""
    page.evaluate("() => { window.scrollTo(0, 0); document.querySelectorAll('.toast').forEach((t) => t.remove()); }")
    shot(page, name)


def close_dialog(page, name):
    page.wait_for_selector(testid(name), state="detached")


def mids(events):
    return sorted(e["systemProperties"].get("message-id") for e in events)


# -- routing ------------------------------------------------------------------------------------

def test_route_made_in_the_console_routes_telemetry(hub, page):
    errors = ConsoleErrors(page)
    hub.create_device("r-dev")
    sign_in(page, hub)
    assert go(page, "routing") == "empty"
    page.wait_for_selector(testid("routes-empty"))

    # A custom endpoint, then a route to it whose condition filters.
    page.click(testid("add-endpoint"))
    page.fill(testid("endpoint-name"), "hot")
    page.fill(testid("endpoint-partitions"), "2")
    page.click(testid("endpoint-save"))
    close_dialog(page, "endpoint-dialog")
    page.wait_for_selector('tr[data-endpoint="hot"]')

    page.click(testid("add-route"))
    page.fill(testid("route-name"), "alerts")
    page.select_option(testid("route-source"), "DeviceMessages")
    page.fill(testid("route-condition"), "level = 'high' AND $body.temp > 30")
    page.check(testid("route-endpoint-hot"))
    page.uncheck(testid("route-endpoint-events"))
    page.click(testid("route-save"))
    close_dialog(page, "route-dialog")
    page.wait_for_selector('tr[data-route="alerts"]')
    assert wait_state(page) == "ready"

    # An enrichment on the custom endpoint.
    page.click(testid("add-enrichment"))
    page.fill(testid("enrichment-key"), "site")
    page.fill(testid("enrichment-value"), "lab-7")
    page.check(testid("enrichment-endpoint-hot"))
    page.uncheck(testid("enrichment-endpoint-events"))
    page.click(testid("enrichment-save"))
    close_dialog(page, "enrichment-dialog")
    page.wait_for_selector('tr[data-enrichment="site"]')

    routing = get_routing(hub)
    assert routing["routes"] == [{"name": "alerts", "source": "DeviceMessages",
                                  "condition": "level = 'high' AND $body.temp > 30",
                                  "endpointNames": ["hot"], "isEnabled": True}]
    assert {"name": "hot", "partitionCount": 2} in routing["endpoints"]
    assert routing["enrichments"] == [{"key": "site", "value": "lab-7", "endpointNames": ["hot"]}]

    # Telemetry through the device REST endpoint: the matching message goes to hot only
    # (enriched), the others fall back to events.
    js = "application/json"
    send_http(hub, "r-dev", '{"temp": 35}', mid="m-hot", props={"level": "high"}, ct=js, ce="utf-8")
    send_http(hub, "r-dev", '{"temp": 20}', mid="m-cool", props={"level": "high"}, ct=js, ce="utf-8")
    send_http(hub, "r-dev", '{"temp": 35}', mid="m-low", props={"level": "low"}, ct=js, ce="utf-8")
    hot = wait_count(hub, "hot", 1)
    assert mids(hot) == ["m-hot"]
    assert hot[0]["properties"]["site"] == "lab-7"
    events = wait_count(hub, "events", 2)
    assert mids(events) == ["m-cool", "m-low"]
    assert all("site" not in e["properties"] for e in events)
    page_shot(page, "routing")

    # The fallback switch: off, an unmatched message is dropped.
    assert page.is_checked(testid("fallback-toggle"))
    page.uncheck(testid("fallback-toggle"))
    eventually(lambda: _assert(get_routing(hub)["fallbackRoute"] == {"isEnabled": False}))
    send_http(hub, "r-dev", '{"temp": 1}', mid="m-dropped", props={"level": "low"}, ct=js, ce="utf-8")
    send_http(hub, "r-dev", '{"temp": 99}', mid="m-hot-2", props={"level": "high"}, ct=js, ce="utf-8")
    assert mids(wait_count(hub, "hot", 2)) == ["m-hot", "m-hot-2"]
    assert mids(read_endpoint(hub, "events")) == ["m-cool", "m-low"]

    # Edit the route to disable it, then delete route, enrichment and endpoint.
    page.click(testid("edit-route-alerts"))
    assert page.locator(testid("route-name")).is_disabled()
    page.uncheck(testid("route-enabled"))
    page.click(testid("route-save"))
    close_dialog(page, "route-dialog")
    eventually(lambda: _assert(get_routing(hub)["routes"][0]["isEnabled"] is False))
    page.wait_for_selector('tr[data-route="alerts"] >> text=disabled')

    # The endpoint is in use: its delete button says so.
    assert page.locator(testid("delete-endpoint-hot")).is_disabled()
    for kind, name in (("route", "alerts"), ("enrichment", "site"), ("endpoint", "hot")):
        page.click(testid(f"delete-{kind}-{name}"))
        page.click(testid("confirm-delete"))
        page.wait_for_selector(f'tr[data-{kind}="{name}"]', state="detached")
    routing = get_routing(hub)
    assert routing["routes"] == [] and routing["enrichments"] == []
    assert [e["name"] for e in routing["endpoints"]] == ["events"]
    errors.assert_none()


def _assert(cond, msg=""):
    assert cond, msg


def run_route_test(page, condition=None, body=None, props=None, content_type=None):
    if condition is not None:
        page.fill(testid("route-test-condition"), condition)
    if body is not None:
        page.fill(testid("route-test-body"), body)
    if props is not None:
        page.fill(testid("route-test-props"), props)
    if content_type is not None:
        page.fill(testid("route-test-content-type"), content_type)
    page.evaluate("() => delete document.querySelector('[data-testid=route-test-result]').dataset.result")
    page.click(testid("route-test-run"))
    el = page.wait_for_selector(f'{testid("route-test-result")}[data-result]')
    return el.get_attribute("data-result"), el.inner_text()


def test_route_test_box_evaluates_conditions(hub, page):
    errors = ConsoleErrors(page)
    errors.allow_status(400)
    put_endpoint(hub, "cold", 1)
    put_route(hub, "chilly", "DeviceMessages", "$body.temp < 5 AND site = 'north'", ["cold"])
    sign_in(page, hub)
    assert go(page, "routing") == "ready"

    # "Test" on a route copies its condition into the box.
    page.click(testid("test-route-chilly"))
    assert page.input_value(testid("route-test-condition")) == "$body.temp < 5 AND site = 'north'"
    assert run_route_test(page, body='{"temp": 2}', props='{"site": "north"}')[0] == "true"
    assert run_route_test(page, body='{"temp": 12}')[0] == "false"
    assert run_route_test(page, body='{"temp": 2}', props='{"site": "south"}')[0] == "false"
    # $body is undefined unless the content type is JSON.
    assert run_route_test(page, body='{"temp": 2}', props='{"site": "north"}', content_type="text/plain")[0] == "false"
    page.fill(testid("route-test-content-type"), "application/json")

    # Twin references.
    page.fill(testid("route-test-twin"), '{"tags": {"site": "lab"}, "properties": {"desired": {}, "reported": {"fw": "2.0"}}}')
    assert run_route_test(page, condition="$twin.tags.site = 'lab' AND $twin.properties.reported.fw = '2.0'")[0] == "true"
    assert run_route_test(page, condition="$twin.tags.site = 'other'")[0] == "false"

    # A condition that does not parse: the hub's 400 and its message.
    result, text = run_route_test(page, condition="level = (")
    assert result == "error"
    assert "400" in text and "parse" in text, text
    # Invalid JSON in the properties is caught in the page, before any request.
    page.fill(testid("route-test-props"), "{not json")
    result, text = run_route_test(page, condition="true")
    assert result == "error" and "Application properties" in text, text
    errors.assert_none()


def test_routing_page_shows_delivery_health_backlog_and_counts(hub, page, tmp_path):
    """A webhook endpoint whose receiver is down and one whose receiver takes everything: the page
    shows each target, health (`unhealthy`, `healthy`), the backlog held, what was delivered and
    its latency; the route's matches; the unmatched counts. Each figure is the hub's own
    (GET /routing/endpointsHealth, /metrics), compared here."""
    from deliverykit import health, metric
    from webhookkit import Receiver

    errors = ConsoleErrors(page)
    hub.create_device("obs-dev")
    closed = Receiver(tmp_path / "hook")  # closed at once: nothing listens at its address
    url, ca = closed.url, closed.ca_cert.read_text()
    closed.close()
    live = Receiver(tmp_path / "hook")  # the same CA: one certificate file for both endpoints
    hook = {"url": url, "signingKey": base64.b64encode(b"k" * 32).decode(), "caCertificate": ca, "timeoutSeconds": 2}
    for name, target in (("hook", hook), ("hook-live", {**hook, "url": live.url})):
        r = rest(hub, "PUT", f"/routing/endpoints/{name}", json={"partitionCount": 1, "webhook": target})
        assert r.status_code == 201, r.text
    put_route(hub, "to-hook", "DeviceMessages", "level = 'high'", ["hook", "hook-live"])
    for i in range(3):
        send_http(hub, "obs-dev", f'{{"n": {i}}}', mid=f"obs-{i}", props={"level": "high"})
    send_http(hub, "obs-dev", '{"n": 9}', mid="obs-unmatched", props={"level": "low"})
    eventually(lambda: _assert(metric(hub, "ferrohub_endpoint_backlog_events", endpoint="hook") == 3))
    eventually(lambda: _assert(health(hub)["hook"]["healthStatus"] == "unhealthy"))
    eventually(lambda: _assert(len(live.received()) == 3))
    eventually(lambda: _assert(metric(hub, "ferrohub_endpoint_deliveries_total", endpoint="hook-live", outcome="delivered") == 3))

    sign_in(page, hub)
    assert go(page, "routing") == "ready"
    row = page.locator('tr[data-endpoint="hook"]')
    target = row.locator(testid("target-hook")).inner_text()
    assert "webhook" in target and url in target, target
    assert row.locator(testid("health-hook")).inner_text() == "unhealthy"
    assert (row.locator(testid("health-hook")).get_attribute("title") or "").startswith("Last error: "), \
        "the health badge names the receiver's last error"
    assert row.locator('td[data-label="Backlog"]').inner_text() == "3"
    assert row.locator(testid("deliveries-hook")).inner_text() == "0 delivered"
    delivered = page.locator('tr[data-endpoint="hook-live"]')
    assert delivered.locator(testid("health-hook-live")).inner_text() == "healthy"
    assert delivered.locator('td[data-label="Backlog"]').inner_text() == "0"
    counts = delivered.locator(testid("deliveries-hook-live")).inner_text()
    assert counts.startswith("3 delivered · latency p50 ") and " / p99 " in counts, counts
    route = page.locator('tr[data-route="to-hook"]')
    assert route.locator('td[data-label="Matched"]').inner_text() == "3"
    builtin = page.locator('tr[data-endpoint="events"]')
    assert builtin.locator('td[data-label="Target"]').inner_text() == "inside the hub"
    assert builtin.locator('td[data-label="Health"]').inner_text() == "—"
    unmatched = page.locator(testid("unmatched-counts")).inner_text()
    assert "1 sent to events" in unmatched and "0 dropped" in unmatched, unmatched
    shot(page, "routing-delivery", full_page=True)
    errors.assert_none()
    live.close()


# -- jobs ----------------------------------------------------------------------------------------

def test_twin_job_made_in_the_console_updates_the_selected_twins(hub, page):
    errors = ConsoleErrors(page)
    fleet = {"job-a": "lab", "job-b": "lab", "job-c": "field"}
    for d, site in fleet.items():
        hub.create_device(d)
        hub.set_tags(d, {"site": site})
    sign_in(page, hub)
    assert go(page, "jobs") == "empty"
    page.wait_for_selector(testid("jobs-empty"))

    page.click(testid("create-job"))
    page.fill(testid("job-id"), "twin-ui-1")
    page.select_option(testid("job-type"), "scheduleUpdateTwin")
    page.fill(testid("job-condition"), "tags.site = 'lab'")
    page.fill(testid("job-max-exec"), "600")
    page.fill(testid("job-twin-patch"), '{"tags": {"patched": "yes"}, "properties": {"desired": {"mode": "eco"}}}')
    page.click(testid("job-save"))
    close_dialog(page, "job-create-dialog")

    # The list refreshes itself while the job runs, until it is completed.
    page.wait_for_selector('tr[data-job="twin-ui-1"][data-status="completed"]', timeout=60_000)
    assert page.inner_text(testid("job-progress-twin-ui-1")).startswith("2/2")
    job = rest(hub, "GET", "/jobs/v2/twin-ui-1").json()
    assert job["status"] == "completed"
    assert job["type"] == "scheduleUpdateTwin" and job["queryCondition"] == "tags.site = 'lab'"
    assert job["maxExecutionTimeInSeconds"] == 600
    assert job["deviceJobStatistics"]["succeededCount"] == 2
    for d, site in fleet.items():
        twin = rest(hub, "GET", f"/twins/{d}").json()
        if site == "lab":
            assert twin["tags"]["patched"] == "yes" and twin["properties"]["desired"]["mode"] == "eco", twin
        else:
            assert "patched" not in twin["tags"] and "mode" not in twin["properties"]["desired"], twin

    # Details: the per-device rows.
    page.click(testid("job-twin-ui-1"))
    page.wait_for_selector(testid("job-devices"))
    rows = page.inner_text(testid("job-devices"))
    assert "job-a" in rows and "job-b" in rows and "job-c" not in rows
    page.keyboard.press("Escape")
    close_dialog(page, "job-dialog")

    # A method job with a bad condition is refused with the hub's 400, in the dialog.
    errors.allow_status(400)
    page.click(testid("create-job"))
    page.select_option(testid("job-type"), "scheduleDeviceMethod")
    page.fill(testid("job-condition"), "tags.site = = 'x'")
    page.fill(testid("job-method-name"), "reboot")
    page.click(testid("job-save"))
    page.wait_for_selector(".dialog-error:has-text('400')")
    page.click(testid("dialog-cancel"))
    close_dialog(page, "job-create-dialog")
    page_shot(page, "jobs")
    errors.assert_none()


def test_job_scheduled_for_later_is_cancelled_in_the_console(hub, page):
    errors = ConsoleErrors(page)
    hub.create_device("late-1")
    sign_in(page, hub)
    go(page, "jobs")
    later = page.evaluate("""() => {
        const d = new Date(Date.now() + 2 * 3600 * 1000), p = (n) => String(n).padStart(2, "0");
        return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
    }""")
    page.click(testid("create-job"))
    page.fill(testid("job-id"), "later-1")
    page.select_option(testid("job-type"), "scheduleDeviceMethod")
    page.fill(testid("job-condition"), "*")
    page.fill(testid("job-start"), later)
    page.fill(testid("job-method-name"), "reboot")
    page.fill(testid("job-method-payload"), '{"delay": 5}')
    page.click(testid("job-save"))
    close_dialog(page, "job-create-dialog")
    page.wait_for_selector('tr[data-job="later-1"][data-status="scheduled"]')
    job = rest(hub, "GET", "/jobs/v2/later-1").json()
    assert job["status"] == "scheduled"
    assert job["cloudToDeviceMethod"]["methodName"] == "reboot"
    assert job["cloudToDeviceMethod"]["payload"] == {"delay": 5}
    start = time.mktime(time.strptime(job["startTime"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert abs(start - (time.time() + 7200)) < 120, job["startTime"]

    page.click(testid("cancel-job-later-1"))
    page.click(testid("confirm-cancel"))
    page.wait_for_selector('tr[data-job="later-1"][data-status="cancelled"]')
    assert rest(hub, "GET", "/jobs/v2/later-1").json()["status"] == "cancelled"
    assert page.locator(testid("cancel-job-later-1")).count() == 0

    # The status filter asks the hub for that status only.
    page.select_option(testid("jobs-status-filter"), "completed")
    page.wait_for_selector(testid("jobs-empty"))
    page.select_option(testid("jobs-status-filter"), "cancelled")
    page.wait_for_selector('tr[data-job="later-1"]')
    errors.assert_none()


def test_jobs_list_is_paged_by_the_hub(hub, page):
    errors = ConsoleErrors(page)
    for i in range(23):
        r = rest(hub, "PUT", f"/jobs/v2/page-{i:02d}", json={
            "type": "scheduleUpdateTwin", "queryCondition": "tags.none = 'x'",
            "updateTwin": {"tags": {"n": i}}, "startTime": "2099-01-01T00:00:00Z"})
        assert r.status_code == 200, r.text
    sign_in(page, hub)
    go(page, "jobs")
    assert page.locator("tr[data-job]").count() == 20
    page.click(testid("jobs-pager-next"))
    page.wait_for_selector(".pager-label:has-text('Page 2')")
    page.wait_for_function("() => document.querySelectorAll('tr[data-job]').length === 3")
    page.click(testid("jobs-pager-prev"))
    page.wait_for_function("() => document.querySelectorAll('tr[data-job]').length === 20")
    errors.assert_none()


# -- configurations ------------------------------------------------------------------------------

def desired(hub, device_id):
    return rest(hub, "GET", f"/twins/{device_id}").json()["properties"]["desired"]


def test_configuration_created_and_deleted_in_the_console(hub, page):
    errors = ConsoleErrors(page)
    for d, env in (("cfg-a", "prod"), ("cfg-b", "prod"), ("cfg-c", "test")):
        hub.create_device(d)
        hub.set_tags(d, {"env": env})
    sign_in(page, hub)
    assert go(page, "configurations") == "empty"

    page.click(testid("create-configuration"))
    page.fill(testid("configuration-id"), "cfg-ui")
    page.fill(testid("configuration-priority"), "7")
    page.fill(testid("configuration-target"), "tags.env = 'prod'")
    page.fill(testid("configuration-content-editor"), '{"properties.desired.telemetry": {"interval": 15}}')
    page.fill(testid("configuration-metrics-editor"),
              '{"fifteen": "SELECT deviceId FROM devices WHERE properties.desired.telemetry.interval = 15"}')
    page.fill(testid("configuration-labels"), '{"team": "ops"}')
    page.click(testid("configuration-check"))
    page.wait_for_selector(f'{testid("configuration-check-result")} >> text=Queries are valid')
    page.click(testid("configuration-save"))
    close_dialog(page, "configuration-edit-dialog")
    page.wait_for_selector('tr[data-configuration="cfg-ui"]')

    c = rest(hub, "GET", "/configurations/cfg-ui").json()
    assert c["priority"] == 7 and c["targetCondition"] == "tags.env = 'prod'" and c["labels"] == {"team": "ops"}
    assert c["content"] == {"deviceContent": {"properties.desired.telemetry": {"interval": 15}}}
    eventually(lambda: _assert(desired(hub, "cfg-a").get("telemetry") == {"interval": 15}))
    eventually(lambda: _assert(desired(hub, "cfg-b").get("telemetry") == {"interval": 15}))
    assert "telemetry" not in desired(hub, "cfg-c")

    # The system metrics, counted when read: refresh until the reconciler's work shows.
    def counts():
        page.click(testid("configurations-refresh"))
        page.wait_for_selector('tr[data-configuration="cfg-ui"]')
        got = (page.inner_text(testid("targeted-cfg-ui")), page.inner_text(testid("applied-cfg-ui")))
        assert got == ("2", "2"), got
        return got
    eventually(counts)
    assert "fifteen: 2" in page.inner_text('tr[data-configuration="cfg-ui"]')
    page.click(testid("configuration-cfg-ui"))
    page.wait_for_selector(testid("configuration-content"))
    assert '"interval": 15' in page.inner_text(testid("configuration-content"))
    page.click(testid("dialog-close"))

    # Edit: the priority changes (etag-checked), the content cannot.
    page.click(testid("edit-configuration-cfg-ui"))
    assert page.get_attribute(testid("configuration-content-editor"), "readonly") is not None
    page.fill(testid("configuration-priority"), "9")
    page.click(testid("configuration-save"))
    close_dialog(page, "configuration-edit-dialog")
    eventually(lambda: _assert(rest(hub, "GET", "/configurations/cfg-ui").json()["priority"] == 9))
    page_shot(page, "configurations")

    page.click(testid("delete-configuration-cfg-ui"))
    page.click(testid("confirm-delete"))
    page.wait_for_selector(testid("configurations-empty"))
    assert rest(hub, "GET", "/configurations/cfg-ui").status_code == 404
    eventually(lambda: _assert("telemetry" not in desired(hub, "cfg-a")))
    errors.assert_none()


# -- certificates --------------------------------------------------------------------------------

def test_certificate_authorities_in_the_console(hub, page, tmp_path):
    errors = ConsoleErrors(page)
    ca_cert, _ = certs.ca(tmp_path, "fleet")
    sign_in(page, hub)
    assert go(page, "certificates") == "empty"
    page.click(testid("add-certificate"))
    page.set_input_files(testid("certificate-file"), str(ca_cert))
    page.wait_for_function("() => document.querySelector('[data-testid=certificate-pem]').value.includes('BEGIN CERTIFICATE')")
    assert page.input_value(testid("certificate-name")) == "fleet-ca"
    page.click(testid("certificate-save"))
    close_dialog(page, "certificate-add-dialog")
    page.wait_for_selector('tr[data-certificate="fleet-ca"]')
    listed = rest(hub, "GET", "/certificates").json()
    assert [(c["name"], c["thumbprint"]) for c in listed] == [("fleet-ca", certs.thumbprint(ca_cert))]
    assert page.inner_text(testid("thumbprint-fleet-ca")) == certs.thumbprint(ca_cert)
    assert "fleet test CA" in page.inner_text('tr[data-certificate="fleet-ca"]')
    page_shot(page, "certificates")

    page.click(testid("certificate-fleet-ca"))
    facts = page.inner_text(testid("certificate-facts"))
    assert certs.sha256_thumbprint(ca_cert)[:8] in facts.replace(":", "")
    page.click(testid("dialog-close"))

    # Not a PEM: the hub's 400 in the dialog.
    errors.allow_status(400)
    page.click(testid("add-certificate"))
    page.fill(testid("certificate-name"), "bad")
    page.fill(testid("certificate-pem"), "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    page.click(testid("certificate-save"))
    page.wait_for_selector(".dialog-error:has-text('400')")
    page.click(testid("dialog-cancel"))

    page.click(testid("delete-certificate-fleet-ca"))
    page.click(testid("confirm-delete"))
    page.wait_for_selector(testid("certificates-empty"))
    assert rest(hub, "GET", "/certificates").json() == []
    errors.assert_none()


# -- policies and rights -------------------------------------------------------------------------

def test_policies_show_keys_only_on_request(hub, page):
    errors = ConsoleErrors(page)
    sign_in(page, hub)
    assert go(page, "policies") == "ready"
    names = page.eval_on_selector_all("[data-policy]", "els => els.map(e => e.dataset.policy)")
    assert set(names) >= {"iothubowner", "service", "device", "registryRead", "registryReadWrite"}
    assert "RegistryRead" in page.inner_text(testid("rights-registryRead"))
    owner_key = hub.policy_key("iothubowner")
    service_key = hub.policy_key("service")
    assert owner_key not in page.content() and service_key not in page.content()

    page.click(testid("show-keys-service"))
    page.wait_for_selector(testid("primary-key-service"))
    assert page.inner_text(testid("primary-key-service")) == service_key
    cs = page.inner_text(testid("connection-string-service"))
    assert cs == f"HostName=localhost:{hub.port};SharedAccessKeyName=service;SharedAccessKey={service_key}"
    assert owner_key not in page.content()
    page_shot(page, "policies")
    page.click(testid("hide-keys-service"))
    page.wait_for_selector(testid("primary-key-service"), state="detached")
    assert service_key not in page.content()
    errors.assert_none()


def test_read_only_policy_cannot_change_or_see_keys(hub, chromium):
    put_endpoint(hub, "ro-ep", 1)
    put_route(hub, "ro-route", "DeviceMessages", "true", ["ro-ep"])
    page = new_page(chromium)
    try:
        errors = ConsoleErrors(page)
        errors.allow_status(401)
        sign_in(page, hub, policy="registryRead")
        go(page, "policies")
        show = page.locator(testid("show-keys-iothubowner"))
        assert show.is_disabled()
        assert "Needs" in show.get_attribute("title")
        # Forced anyway: the hub refuses with 401, shown in place.
        page.evaluate("() => { document.querySelector('[data-testid=\"show-keys-iothubowner\"]').disabled = false; }")
        show.click()
        err = page.wait_for_selector(testid("keys-error-iothubowner"))
        assert "401" in err.inner_text()
        assert hub.policy_key("iothubowner") not in page.content()

        # Routing: readable, every change disabled with the missing right named; the test box works.
        assert go(page, "routing") == "ready"
        for b in ("add-route", "add-endpoint", "add-enrichment", "edit-route-ro-route", "delete-route-ro-route", "fallback-toggle"):
            loc = page.locator(testid(b))
            assert loc.is_disabled(), b
            assert "RegistryWrite" in (loc.get_attribute("title") or ""), b
        assert run_route_test(page, condition="true")[0] == "true"
        # Jobs: registryRead may list but not create; configurations and certificates likewise.
        go(page, "jobs")
        assert page.locator(testid("create-job")).is_disabled()
        go(page, "configurations")
        assert page.locator(testid("create-configuration")).is_disabled()
        go(page, "certificates")
        assert page.locator(testid("add-certificate")).is_disabled()

        # A forced change through the page's own API client shows the hub's 401.
        go(page, "routing")
        page.evaluate("() => { document.querySelector('[data-testid=\"add-route\"]').disabled = false; }")
        page.click(testid("add-route"))
        page.fill(testid("route-name"), "sneaky")
        page.click(testid("route-save"))
        page.wait_for_selector(".dialog-error:has-text('401')")
        page.click(testid("dialog-cancel"))
        assert [r["name"] for r in get_routing(hub)["routes"]] == ["ro-route"]
        errors.assert_none()
    finally:
        page.context.close()


def test_service_policy_sees_a_401_page_for_routing(hub, chromium):
    """A policy without RegistryRead: the routing page is the hub's 401 error state."""
    page = new_page(chromium)
    try:
        errors = ConsoleErrors(page)
        errors.allow_status(401)
        sign_in(page, hub, policy="service")
        assert go(page, "routing", ("ready", "empty", "error")) == "error"
        assert "401" in page.inner_text(".error-state")
        # Jobs need ServiceConnect or RegistryRead: the service policy lists them.
        assert go(page, "jobs", ("ready", "empty", "error")) == "empty"
        assert not page.locator(testid("create-job")).is_disabled()
        errors.assert_none()
    finally:
        page.context.close()


# -- phone size and keyboard ---------------------------------------------------------------------

@pytest.mark.parametrize("route", ["routing", "jobs", "configurations", "certificates", "policies"])
def test_admin_pages_fit_a_phone(hub, chromium, route):
    put_endpoint(hub, "ph", 1)
    put_route(hub, "phone-route", "DeviceMessages", "$body.temperature > 30 AND level = 'critical'", ["ph", "events"])
    rest(hub, "PUT", "/jobs/v2/phone-job", json={"type": "scheduleUpdateTwin", "queryCondition": "*",
                                                  "updateTwin": {"tags": {"x": 1}}, "startTime": "2099-01-01T00:00:00Z"})
    rest(hub, "PUT", "/configurations/phone-cfg", json={
        "priority": 1, "targetCondition": "tags.env = 'prod'",
        "content": {"deviceContent": {"properties.desired.a": 1}}})
    page = new_page(chromium, viewport=PHONE)
    try:
        errors = ConsoleErrors(page)
        sign_in(page, hub)
        go(page, route)
        assert page.is_hidden("nav#main-nav a[href='#/routing']")
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"{route} is {width}px wide at {PHONE['width']}px"
        # The navigation opens from the menu button and reaches the page by keyboard.
        page.click("#nav-toggle")
        page.wait_for_selector(f"nav#main-nav a[href='#/{route}']", state="visible")
        errors.assert_none()
    finally:
        page.context.close()


def test_dialogs_work_from_the_keyboard(hub, page):
    errors = ConsoleErrors(page)
    sign_in(page, hub)
    go(page, "routing")
    page.focus(testid("add-route"))
    page.keyboard.press("Enter")
    page.wait_for_selector(testid("route-dialog"))
    # Focus starts in the dialog's first field and Tab stays inside it.
    assert page.evaluate("() => document.activeElement.dataset.testid") == "route-name"
    for _ in range(5):
        page.keyboard.press("Tab")
        assert page.evaluate("() => !!document.activeElement.closest('dialog')")
    page.keyboard.press("Escape")
    close_dialog(page, "route-dialog")
    assert get_routing(hub)["routes"] == []
    errors.assert_none()
