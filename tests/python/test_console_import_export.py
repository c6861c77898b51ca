"""The console's registry import and export (Jobs page, "Import and export"; docs/console.md) in
headless Chromium against a real hub on the SDKs' ports and Azurite: an export job started in the
console writes devices.txt to an Azurite container (read back with the storage SDK); the file the
console itself downloads holds the same lines; devices deleted and imported back from that file
have their keys, tags and desired properties again, and the official Python device SDK connects
with a restored key and sends; a file with a bad line imports nothing and says which line; a
refused line is reported with its line number; an import job from a container started in the
console completes; a job that fails shows why; policies without the rights see the buttons
disabled, and a file that writes twins is refused to a policy without ServiceConnect.

Run under `flock /tmp/ferrohub-fixed-ports.lock` or in a network namespace of its own (the
`sdk_hub` fixture binds 443/8883/5671)."""

import base64
import json
import time
import urllib.parse
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from azure.iot.device import IoTHubDeviceClient, Message
from azure.storage.blob import ContainerSasPermissions, generate_container_sas

from azurite import ACCOUNT_KEY, ACCOUNT_NAME, Azurite
from consolekit import PHONE, ConsoleErrors, browser, go, new_page, shot, sign_in, testid
from jobkit import azurite_container, read_lines, write_lines

JOB_TIMEOUT_MS = 60_000
FINISHED = ("completed", "failed", "cancelled")


def key(n: int) -> str:
    """A distinct, valid 32-byte symmetric key (base64)."""
    return base64.b64encode(bytes([n]) * 32).decode()


# The registry this module starts from: devices with keys of their own, tags, one desired
# property, and a module.
DEVICES = {
    "iex-1": {"tags": {"site": "lyon", "line": 1}},
    "iex-2": {"tags": {"site": "lyon", "line": 2}},
    "iex-3": {"tags": {"site": "nantes", "floor": {"n": 3}}, "desired": {"interval": 30, "mode": "eco"}},
    "iex-4": {"tags": {"site": "nantes"}},
    "iex-5": {"tags": {"owner": "o'neil"}},
}
MODULE = ("iex-1", "mod-a")


@pytest.fixture(scope="module")
def chromium():
    with browser() as b:
        yield b


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    with Azurite(tmp_path_factory.mktemp("azurite") / "blob") as b:
        yield b


@pytest.fixture
def owner_page(chromium, sdk_hub):
    """The Jobs page signed in as iothubowner; a refused bulk item is a 400 on purpose."""
    p = new_page(chromium)
    errors = ConsoleErrors(p)
    errors.allow_status(400)
    sign_in(p, sdk_hub)
    go(p, "jobs")
    yield p
    errors.assert_none()
    p.context.close()


def q(s):
    return urllib.parse.quote(s, safe="")


def rest(hub, method, path, policy="iothubowner", **kw):
    return hub.request(method, path, hub.token(policy), **kw)


def identity(hub, device_id, module_id=None):
    path = f"/devices/{q(device_id)}" + (f"/modules/{q(module_id)}" if module_id else "")
    r = rest(hub, "GET", path)
    if r.status_code == 404:
        return None
    assert r.status_code == 200, r.text
    return r.json()


def twin(hub, device_id, module_id=None):
    r = rest(hub, "GET", f"/twins/{q(device_id)}" + (f"/modules/{q(module_id)}" if module_id else ""))
    assert r.status_code == 200, r.text
    return r.json()


def keys_of(ident):
    k = ident["authentication"]["symmetricKey"]
    return k["primaryKey"], k["secondaryKey"]


def by_identity(lines):
    out = {(l["id"], l.get("moduleId")): l for l in lines}
    assert len(out) == len(lines), "an identity is listed twice"
    return out


def without_reported_versions(line):
    """The line without `$lastUpdatedVersion` in reported `$metadata`: the export job writes it
    (for an exact offline restore) and the twin API, hence the console's file, does not."""
    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "$lastUpdatedVersion"}
        return node
    line = json.loads(json.dumps(line))
    reported = line["properties"]["reported"]
    reported["$metadata"] = strip(reported["$metadata"])
    return line


def blob_text(container, name):
    return container.download_blob(name).readall().decode()


def open_dialog(page, button, name):
    page.click(testid(button))
    page.wait_for_selector(f"dialog{testid(name)}")


def closed(page, name):
    page.wait_for_selector(f"dialog{testid(name)}", state="detached")


def result_state(page):
    page.wait_for_function("() => ['ok', 'partial', 'failed'].includes(document.querySelector('[data-testid=registry-result]').dataset.state)")
    return page.get_attribute(testid("registry-result"), "data-state")


def start_job(page, button, dialog_name, fields, start):
    """Opens a job dialog, fills its fields, starts it; returns the job id the page shows."""
    open_dialog(page, button, dialog_name)
    for name, value in fields.items():
        page.fill(testid(name), value)
    page.click(testid(start))
    closed(page, dialog_name)
    assert result_state(page) == "ok"
    job_id = page.get_attribute(testid("registry-result"), "data-job-id")
    assert job_id and job_id in page.inner_text(testid("registry-result"))
    return job_id


def wait_job_row(page, job_id):
    """Waits (bounded) until the console's list shows the job finished, refreshing by itself;
    returns (status, the row's text)."""
    row = f'tr[data-testid=import-job-row][data-job="{job_id}"]'
    page.wait_for_selector(row)
    page.wait_for_function(
        "([sel, done]) => done.includes(document.querySelector(sel)?.dataset.status)",
        arg=[row, list(FINISHED)], timeout=JOB_TIMEOUT_MS)
    return page.get_attribute(row, "data-status"), page.inner_text(row)


def download(page, path: Path, exclude_keys=False):
    """Downloads devices.txt through the console into `path`; returns its text."""
    open_dialog(page, "download-identities", "download-dialog")
    if exclude_keys:
        page.check(testid("download-exclude-keys"))
    with page.expect_download(timeout=JOB_TIMEOUT_MS) as dl:
        page.click(testid("download-start"))
    assert dl.value.suggested_filename == "devices.txt"
    dl.value.save_as(str(path))
    closed(page, "download-dialog")
    assert result_state(page) == "ok"
    return path.read_text()


def choose_file(page, path: Path):
    """Opens Import from a file and chooses `path`; returns the check's state."""
    open_dialog(page, "import-file", "import-file-dialog")
    page.set_input_files(testid("import-file-input"), str(path))
    page.wait_for_function("() => ['valid', 'invalid'].includes(document.querySelector('[data-testid=import-file-check]').dataset.state)")
    return page.get_attribute(testid("import-file-check"), "data-state")


def failures(page):
    """[(line, device id, text)] of the failures the result lists."""
    return page.eval_on_selector_all(testid("registry-failure"), "ls => ls.map(l => [l.dataset.line, l.dataset.deviceId, l.textContent])")


def seed(hub):
    for i, (d, spec) in enumerate(DEVICES.items(), start=1):
        hub.create_device(d, authentication={"type": "sas", "symmetricKey": {"primaryKey": key(i), "secondaryKey": key(50 + i)}})
        patch = {"tags": spec["tags"]}
        if "desired" in spec:
            patch["properties"] = {"desired": spec["desired"]}
        r = rest(hub, "PATCH", f"/twins/{d}", json=patch)
        assert r.status_code == 200, r.text
    hub.create_module(*MODULE, authentication={"type": "sas", "symmetricKey": {"primaryKey": key(99), "secondaryKey": key(98)}})
    r = rest(hub, "PATCH", f"/twins/{MODULE[0]}/modules/{MODULE[1]}", json={"tags": {"role": "sensor"}})
    assert r.status_code == 200, r.text


def check_seeded(hub):
    """The registry holds the seeded devices and module again: keys, tags, desired properties."""
    for i, (d, spec) in enumerate(DEVICES.items(), start=1):
        ident = identity(hub, d)
        assert ident is not None, d
        assert keys_of(ident) == (key(i), key(50 + i)), d
        t = twin(hub, d)
        assert t["tags"] == spec["tags"], d
        desired = {k: v for k, v in t["properties"]["desired"].items() if not k.startswith("$")}
        assert desired == spec.get("desired", {}), d
    m = identity(hub, *MODULE)
    assert m is not None and keys_of(m) == (key(99), key(98))
    assert twin(hub, *MODULE)["tags"] == {"role": "sensor"}


def test_export_job_download_and_import_back_from_the_file(owner_page, sdk_hub, blob, tmp_path):
    page = owner_page
    # The first test of the module: the registry holds exactly what it seeds.
    seed(sdk_hub)
    r = rest(sdk_hub, "GET", "/devices")
    assert sorted(d["deviceId"] for d in r.json()) == sorted(DEVICES)
    expected = {(d, None) for d in DEVICES} | {MODULE}

    # 1. An export job to an Azurite container, with keys, started and followed in the console.
    uri, container = azurite_container(blob, "console-export")
    job_id = start_job(page, "export-job", "export-job-dialog", {"export-job-output": uri}, "export-job-start")
    status, text = wait_job_row(page, job_id)
    assert status == "completed", text
    assert "100%" in text and "Export" in text
    assert "sig=" not in text  # the SAS is never shown
    job = rest(sdk_hub, "GET", f"/jobs/{job_id}").json()
    assert job["status"] == "completed" and job["excludeKeysInExport"] is False
    exported_text = blob_text(container, "devices.txt")
    exported = by_identity(read_lines(exported_text))
    assert set(exported) == expected
    for i, (d, spec) in enumerate(DEVICES.items(), start=1):
        line = exported[(d, None)]
        assert line["authentication"]["symmetricKey"] == {"primaryKey": key(i), "secondaryKey": key(50 + i)}, d
        assert line["tags"] == spec["tags"], d
        for k, v in spec.get("desired", {}).items():
            assert line["properties"]["desired"][k] == v, d
    assert exported[MODULE]["authentication"]["symmetricKey"]["primaryKey"] == key(99)
    assert exported[MODULE]["tags"] == {"role": "sensor"}

    # 2. The console's own download: the export job's lines (same fields, same order), keys included.
    file = tmp_path / "devices.txt"
    downloaded_text = download(page, file)
    assert "Saved devices.txt: 5 devices and 1 module, with their keys" in page.inner_text(testid("registry-result"))
    downloaded = by_identity(read_lines(downloaded_text))
    assert set(downloaded) == expected
    for ident, line in downloaded.items():
        job_line = without_reported_versions(exported[ident])
        assert line == job_line, ident
        assert list(line) == list(job_line), ident  # the job's field order
    # Same identity order too: each device followed by its modules, by id.
    assert [(l["id"], l.get("moduleId")) for l in read_lines(downloaded_text)] == \
           [(l["id"], l.get("moduleId")) for l in read_lines(exported_text)]
    # Without keys: authentication is null on every line, as with excludeKeysInExport.
    nokeys = read_lines(download(page, tmp_path / "nokeys.txt", exclude_keys=True))
    assert len(nokeys) == len(expected) and all(l["authentication"] is None for l in nokeys)
    assert "without keys" in page.inner_text(testid("registry-result"))

    # 3. Deleted behind the console's back, then imported from the downloaded file.
    for d in DEVICES:
        assert rest(sdk_hub, "DELETE", f"/devices/{d}").status_code == 204
    assert all(identity(sdk_hub, d) is None for d in DEVICES)
    assert choose_file(page, file) == "valid"
    check = page.inner_text(testid("import-file-check"))
    assert "6 lines to apply (6 createOrUpdate)" in check and "6 lines with tags or desired properties" in check, check
    page.click(testid("import-file-start"))
    closed(page, "import-file-dialog")
    assert result_state(page) == "ok", page.inner_text(testid("registry-result"))
    assert "Imported devices.txt: 6 lines applied." in page.inner_text(testid("registry-result"))
    check_seeded(sdk_hub)

    # The official device SDK connects with a restored key (the one the test chose) and sends.
    client = IoTHubDeviceClient.create_from_connection_string(
        f"HostName=localhost;DeviceId=iex-2;SharedAccessKey={key(2)}", server_verification_cert=Path(sdk_hub.ca).read_text())
    try:
        client.connect()
        client.send_message(Message(json.dumps({"restored": True}), content_encoding="utf-8", content_type="application/json"))
    finally:
        client.shutdown()
    deadline = time.time() + 20
    while b'{"restored": true}' not in [base64.b64decode(e["body"]) for e in sdk_hub.events_of("iex-2")]:
        assert time.time() < deadline, "the restored device's message never reached the built-in endpoint"
        time.sleep(0.2)

    shot(page, "jobs-import-export", at=testid("import-export"))


def test_a_file_with_a_bad_line_imports_nothing(owner_page, sdk_hub, tmp_path):
    page = owner_page
    bad = write_lines(tmp_path / "bad.txt", [
        {"id": "iex-bad-1", "tags": {"x": 1}},
        "{this is not json",
        {"id": "iex-bad-2", "importMode": "merge"},
        {"id": "iex-bad-3"},
    ])
    assert choose_file(page, bad) == "invalid"
    errs = page.eval_on_selector_all(testid("import-file-error"), "ls => ls.map(l => [l.dataset.line, l.textContent])")
    assert [line for line, _ in errs] == ["2", "3"], errs
    assert "not JSON" in errs[0][1] and "Line 2" in errs[0][1]
    assert "merge" in errs[1][1] and "iex-bad-2" in errs[1][1]
    assert "nothing will be changed" in page.inner_text(testid("import-file-check"))
    start = page.locator(testid("import-file-start"))
    assert start.is_disabled()
    shot(page, "jobs-import-file-errors")
    # Forced anyway, the dialog refuses it.
    page.evaluate("() => { document.querySelector('[data-testid=\"import-file-start\"]').disabled = false; }")
    start.click()
    page.wait_for_selector(".dialog-error:has-text('every line')")
    page.click(testid("dialog-cancel"))
    closed(page, "import-file-dialog")
    for d in ("iex-bad-1", "iex-bad-2", "iex-bad-3"):
        assert identity(sdk_hub, d) is None, d

    # A file that reads well but has a line the registry refuses: the others are applied and
    # the refused one is listed with its line number and the hub's reason.
    sdk_hub.create_device("iex-taken")
    mixed = write_lines(tmp_path / "mixed.txt", [
        {"id": "iex-new-1", "importMode": "create", "tags": {"from": "file"}},
        {"id": "iex-taken", "importMode": "create"},
        {"id": "iex-new-2", "status": "disabled"},
    ])
    assert choose_file(page, mixed) == "valid"
    page.click(testid("import-file-start"))
    closed(page, "import-file-dialog")
    assert result_state(page) == "partial"
    assert "2 of 3 lines applied; 1 failed" in page.inner_text(testid("registry-result"))
    listed = failures(page)
    assert [(line, d) for line, d, _ in listed] == [("2", "iex-taken")], listed
    assert "DeviceAlreadyExists" in listed[0][2]
    assert twin(sdk_hub, "iex-new-1")["tags"] == {"from": "file"}
    assert identity(sdk_hub, "iex-new-2")["status"] == "disabled"


def test_import_job_from_a_container_and_a_failed_job(owner_page, sdk_hub, blob, tmp_path):
    page = owner_page
    uri, container = azurite_container(blob, "console-import")
    lines = [
        {"id": "iex-job-1", "authentication": {"type": "sas", "symmetricKey": {"primaryKey": key(11), "secondaryKey": key(12)}},
         "tags": {"from": "container"}, "properties": {"desired": {"rate": 5}}},
        {"id": "iex-job-2", "status": "disabled", "tags": {"from": "container"}},
        {"id": "iex-job-1", "importMode": "create"},  # refused: it exists by then
    ]
    container.upload_blob("devices.txt", "".join(json.dumps(l) + "\n" for l in lines))
    # The output container left empty: importErrors.log goes to the input container.
    job_id = start_job(page, "import-job", "import-job-dialog", {"import-job-input": uri}, "import-job-start")
    status, text = wait_job_row(page, job_id)
    assert status == "completed", text
    assert "Import" in text and "100%" in text
    ident = identity(sdk_hub, "iex-job-1")
    assert ident is not None and keys_of(ident) == (key(11), key(12))
    assert twin(sdk_hub, "iex-job-1")["tags"] == {"from": "container"}
    assert twin(sdk_hub, "iex-job-1")["properties"]["desired"]["rate"] == 5
    assert identity(sdk_hub, "iex-job-2")["status"] == "disabled"
    logged = read_lines(blob_text(container, "importErrors.log"))
    assert [(e["lineNumber"], e["deviceId"]) for e in logged] == [(3, "iex-job-1")], logged

    # An export to a container that does not exist (its SAS well signed) fails; the console
    # shows the hub's reason.
    sas = generate_container_sas(ACCOUNT_NAME, "no-such-container", account_key=ACCOUNT_KEY,
                                 permission=ContainerSasPermissions(read=True, write=True, create=True, list=True),
                                 expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    missing = f"http://{blob.host}:{blob.port}/{ACCOUNT_NAME}/no-such-container?{sas}"
    job_id = start_job(page, "export-job", "export-job-dialog", {"export-job-output": missing}, "export-job-start")
    status, text = wait_job_row(page, job_id)
    assert status == "failed", text
    reason = page.text_content(f'tr[data-job="{job_id}"] {testid("import-job-failure")}')
    assert reason and reason == rest(sdk_hub, "GET", f"/jobs/{job_id}").json()["failureReason"]
    assert "ContainerNotFound" in reason, reason
    # A URL that is not one is refused in the dialog, which stays open.
    open_dialog(page, "export-job", "export-job-dialog")
    page.fill(testid("export-job-output"), "not a url")
    page.click(testid("export-job-start"))
    page.wait_for_selector(".dialog-error:has-text('not a URL')")
    page.click(testid("dialog-cancel"))


def test_buttons_follow_the_policys_rights(chromium, sdk_hub, tmp_path):
    def buttons(page):
        return {b: (page.locator(testid(b)).is_disabled(), page.locator(testid(b)).get_attribute("title") or "")
                for b in ("export-job", "import-job", "download-identities", "import-file")}

    for policy, expect in [
        # registryRead: exports, never imports.
        ("registryRead", {"export-job": None, "download-identities": None, "import-job": "RegistryWrite", "import-file": "RegistryWrite"}),
        # service (ServiceConnect only): nothing of the registry, and the list says why.
        ("service", {"export-job": "RegistryRead", "download-identities": "RegistryRead", "import-job": "RegistryWrite", "import-file": "RegistryWrite"}),
    ]:
        page = new_page(chromium)
        try:
            errors = ConsoleErrors(page)
            sign_in(page, sdk_hub, policy=policy)
            go(page, "jobs")
            seen = buttons(page)
            for b, needs in expect.items():
                disabled, title = seen[b]
                assert disabled == (needs is not None), (policy, b)
                if needs:
                    assert f"Needs {needs}" in title, (policy, b, title)
            if policy == "service":
                assert "Needs RegistryRead" in page.inner_text(testid("imports"))
            errors.assert_none()
        finally:
            page.context.close()

    # registryReadWrite may import, but a file that writes twins needs ServiceConnect too: it is
    # refused before anything is sent, never applied without its tags.
    page = new_page(chromium)
    try:
        errors = ConsoleErrors(page)
        sign_in(page, sdk_hub, policy="registryReadWrite")
        go(page, "jobs")
        f = write_lines(tmp_path / "tags.txt", [{"id": "iex-rw-1", "tags": {"a": 1}}, {"id": "iex-rw-2"}])
        assert choose_file(page, f) == "invalid"
        assert "ServiceConnect" in page.inner_text(testid("import-file-check"))
        assert page.locator(testid("import-file-start")).is_disabled()
        page.click(testid("dialog-cancel"))
        assert identity(sdk_hub, "iex-rw-1") is None and identity(sdk_hub, "iex-rw-2") is None
        # Without twin parts it goes through.
        f = write_lines(tmp_path / "plain.txt", [{"id": "iex-rw-2"}])
        assert choose_file(page, f) == "valid"
        page.click(testid("import-file-start"))
        closed(page, "import-file-dialog")
        assert result_state(page) == "ok"
        assert identity(sdk_hub, "iex-rw-2") is not None
        errors.assert_none()
    finally:
        page.context.close()


def test_the_section_fits_a_phone(chromium, sdk_hub):
    page = new_page(chromium, viewport=PHONE)
    try:
        errors = ConsoleErrors(page)
        sign_in(page, sdk_hub)
        go(page, "jobs")
        page.wait_for_selector(f'{testid("imports")}[data-state=ready], {testid("imports")}[data-state=empty]')
        width = page.evaluate("() => document.documentElement.scrollWidth")
        # What sticks out, named in the failure.
        wide = page.evaluate("""(w) => [...document.querySelectorAll('main#page *')]
            .filter((e) => e.getBoundingClientRect().right > w)
            .slice(-3).map((e) => `${e.tagName}.${e.className} ${e.dataset.testid || ''} ${Math.round(e.getBoundingClientRect().right)}`)""", PHONE["width"])
        assert width <= PHONE["width"], f"the jobs page is {width}px wide at {PHONE['width']}px: {wide}"
        for b in ("export-job", "import-job", "download-identities", "import-file"):
            box = page.locator(testid(b)).bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], b
        shot(page, "jobs-import-export-phone", at=testid("import-export"))
        errors.assert_none()
    finally:
        page.context.close()
