"""QRY-1 (issue 15, part 1): the twin query language through the official service SDK
(`IoTHubRegistryManager.query_iot_hub`) and REST: paging through 5,000 twins with page sizes
1, 100 and 1000, each twin exactly once; every operator and function; GROUP BY against a count
done here; a malformed query's 400 body; and a query issued right after an acknowledged write
sees it, 1,000 times in a row."""

import collections
import json
import subprocess

import pytest
from azure.iot.hub import IoTHubRegistryManager
from azure.iot.hub.models import QuerySpecification

from hubkit import REPO, Hub
from jobkit import import_devices
from mqttraw import PUBLISH, connect_device
from test_node_sdk import node_env

N = 5000
PLANTS = ["Redmond43", "Lyon", "Recife"]


def tags_of(i):
    tags = {"k": i, "plant": PLANTS[i % 3], "grp": i % 7, "name": f"dev-{i:05d}"}
    if i % 10 == 0:
        tags["rare"] = True
    return tags


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A hub with N devices (tags as `tags_of`) imported by an import job, plus 10 modules."""
    base = tmp_path_factory.mktemp("query")
    hub = Hub(base / "hub")
    # The fixed ports: the Node SDK reaches the hub on 443.
    hub.https_addr, hub.mqtt_addr, hub.amqp_addr = "127.0.0.1:443", "127.0.0.1:8883", "127.0.0.1:5671"
    hub.start()
    lines = [{"id": f"q{i:05d}", "tags": tags_of(i)} for i in range(N)]
    lines += [{"id": f"q{i:05d}", "moduleId": f"m{j}"} for i in range(5) for j in range(2)]
    import_devices(hub, base, lines)
    yield hub
    hub.kill()


@pytest.fixture
def registry(fleet, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", fleet.ca)
    return IoTHubRegistryManager.from_connection_string(fleet.connection_string("iothubowner"))


def query_all(registry, text, page=None):
    """Every item of a query, page by page, and the number of pages."""
    items, token, pages = [], None, 0
    while True:
        result = registry.query_iot_hub(QuerySpecification(query=text), token, page)
        pages += 1
        items.extend(result.items)
        token = result.continuation_token
        if not token:
            return items, pages, result.type


@pytest.mark.parametrize("page", [1, 100, 1000])
def test_paging_returns_every_twin_exactly_once(registry, page):
    items, pages, kind = query_all(registry, "SELECT * FROM devices", page)
    ids = [t.device_id for t in items]
    assert len(ids) == N and len(set(ids)) == N, (len(ids), len(set(ids)))
    assert pages == -(-N // page), pages
    assert kind == "twin"
    sample = next(t for t in items if t.device_id == "q00042")
    assert sample.tags == tags_of(42)
    assert sample.status == "enabled" and sample.connection_state == "Disconnected"


def node_query(hub, sql, page, as_twin=True):
    request = {"connectionString": hub.connection_string("iothubowner", with_port=False), "sql": sql,
               "pageSize": page, "asTwin": as_twin}
    done = subprocess.run(["node", str(REPO / "tests" / "node" / "registry_query.js")], input=json.dumps(request),
                          capture_output=True, text=True, timeout=600, env=node_env(hub))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("page", [1, 100, 1000])
def test_node_create_query_pages_through_every_twin_once(fleet, page):
    result = node_query(fleet, "SELECT * FROM devices", page)
    assert len(result["ids"]) == N and len(set(result["ids"])) == N
    assert result["pages"] == -(-N // page)
    assert result["rows"][0] == {"deviceId": "q00000", "tags": tags_of(0)}
    raw = node_query(fleet, "SELECT tags.plant AS plant, COUNT() AS n FROM devices GROUP BY tags.plant", 2, as_twin=False)
    assert raw["pages"] == 2 and sorted((r["plant"], r["n"]) for r in raw["rows"]) == sorted(
        collections.Counter(tags_of(i)["plant"] for i in range(N)).items())


def test_module_twins_page_too(registry):
    items, pages, kind = query_all(registry, "SELECT * FROM devices.modules", 3)
    assert sorted((t.device_id, t.module_id) for t in items) == [(f"q{i:05d}", f"m{j}") for i in range(5) for j in range(2)]
    assert pages == 4 and kind == "twin"


def ids(registry, where, page=1000):
    items, _, _ = query_all(registry, f"SELECT * FROM devices WHERE {where}", page)
    return sorted(t.device_id for t in items)


def expect(pred):
    return sorted(f"q{i:05d}" for i in range(N) if pred(i, tags_of(i)))


CASES = [
    ("tags.plant = 'Redmond43'", lambda i, t: t["plant"] == "Redmond43"),
    ("tags.plant != 'Redmond43'", lambda i, t: t["plant"] != "Redmond43"),
    ("tags.plant <> 'Lyon'", lambda i, t: t["plant"] != "Lyon"),
    ("tags.k < 10", lambda i, t: i < 10),
    ("tags.k <= 10", lambda i, t: i <= 10),
    ("tags.k > 4990", lambda i, t: i > 4990),
    ("tags.k >= 4990", lambda i, t: i >= 4990),
    ("tags.k >= 100 AND tags.k < 120 AND tags.grp = 3", lambda i, t: 100 <= i < 120 and i % 7 == 3),
    ("tags.k < 5 OR tags.k > 4995", lambda i, t: i < 5 or i > 4995),
    ("NOT (tags.k > 3) AND tags.k >= 0", lambda i, t: i <= 3),
    ("tags.grp IN [1, 2] AND tags.k < 30", lambda i, t: i % 7 in (1, 2) and i < 30),
    ("tags.plant NIN ['Lyon', 'Recife']", lambda i, t: t["plant"] == "Redmond43"),
    ("IS_DEFINED(tags.rare)", lambda i, t: "rare" in t),
    ("NOT IS_DEFINED(tags.rare) AND tags.k < 12", lambda i, t: "rare" not in t and i < 12),
    # Twins hold no nulls (a null removes a property), so IS_NULL is shown on expressions.
    ("IS_NULL(null) AND NOT IS_NULL(tags.k) AND tags.k < 2", lambda i, t: i < 2),
    ("IS_BOOL(tags.rare)", lambda i, t: "rare" in t),
    ("IS_NUMBER(tags.k) AND tags.k < 3", lambda i, t: i < 3),
    ("IS_STRING(tags.plant) AND tags.k < 3", lambda i, t: i < 3),
    ("IS_OBJECT(tags) AND tags.k < 3", lambda i, t: i < 3),
    ("IS_ARRAY(tags.plant)", lambda i, t: False),
    ("IS_PRIMITIVE(tags.k) AND tags.k < 2", lambda i, t: i < 2),
    ("STARTSWITH(tags.name, 'dev-0001')", lambda i, t: t["name"].startswith("dev-0001")),
    ("ENDSWITH(tags.name, '777')", lambda i, t: t["name"].endswith("777")),
    ("CONTAINS(tags.name, '-123')", lambda i, t: "-123" in t["name"]),
    ("tags.k * 2 + 1 = 21", lambda i, t: i == 10),
    ("tags.k % 1000 = 7 AND tags.k - 7 >= 1000", lambda i, t: i % 1000 == 7 and i >= 1007),
    ("tags.k / 4 = 2.5", lambda i, t: i == 10),
    ("deviceId = 'q00123'", lambda i, t: i == 123),
    ("DeviceId = 'q00124' OR devices.deviceId = 'q00125'", lambda i, t: i in (124, 125)),
    ("status = 'enabled' AND connectionState = 'Disconnected' AND tags.k < 4", lambda i, t: i < 4),
    ("capabilities.iotEdge = false AND tags.k < 2", lambda i, t: i < 2),
    ("properties.desired.$version = 1 AND tags.k < 2", lambda i, t: i < 2),
]


@pytest.mark.parametrize("where,pred", CASES, ids=[c[0] for c in CASES])
def test_every_operator_and_function(registry, where, pred):
    assert ids(registry, where) == expect(pred)


def test_projections_counts_and_group_by(registry, fleet):
    items, _, kind = query_all(registry, "SELECT deviceId, tags.plant AS plant FROM devices WHERE tags.k < 3")
    assert kind == "raw"
    rows = [{"deviceId": t.device_id, **t.additional_properties} for t in items]
    assert rows == [{"deviceId": f"q{i:05d}", "plant": PLANTS[i % 3]} for i in range(3)]
    r = fleet.request("POST", "/devices/query", fleet.token(), json={"query": "SELECT COUNT() AS n FROM devices"})
    assert r.status_code == 200 and r.json() == [{"n": N}] and r.headers["x-ms-item-type"] == "raw"
    assert "x-ms-continuation" not in r.headers
    r = fleet.request("POST", "/devices/query", fleet.token(),
                      json={"query": "SELECT tags.plant AS plant, tags.grp AS grp, COUNT() AS n FROM devices GROUP BY tags.plant, tags.grp"})
    assert r.status_code == 200, r.text
    counted = collections.Counter((tags_of(i)["plant"], tags_of(i)["grp"]) for i in range(N))
    assert {(row["plant"], row["grp"]): row["n"] for row in r.json()} == counted
    r = fleet.request("POST", "/devices/query", fleet.token(),
                      json={"query": "SELECT SUM(tags.k) AS s, MIN(tags.k) AS lo, MAX(tags.k) AS hi, AVG(tags.grp) AS a FROM devices WHERE tags.plant = 'Lyon'"})
    lyon = [i for i in range(N) if i % 3 == 1]
    assert r.json() == [{"s": sum(lyon), "lo": min(lyon), "hi": max(lyon), "a": pytest.approx(sum(i % 7 for i in lyon) / len(lyon))}]
    items, pages, _ = query_all(registry, "SELECT TOP 25 * FROM devices WHERE tags.plant = 'Recife'", 10)
    assert [t.device_id for t in items] == [f"q{i:05d}" for i in range(N) if i % 3 == 2][:25] and pages == 3


def test_malformed_queries_get_a_400_naming_the_position(fleet):
    token = fleet.token()
    for text, where in [("SELECT * FROM devics", "Line 1:15"), ("SELECT *\nFROM devices WHERE tags.k = ", "Line 2:29"),
                        ("SELECT * FROM devices WHERE STARTS_WITH(deviceId, 'a')", "Line 1:29")]:
        r = fleet.request("POST", "/devices/query", token, json={"query": text})
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["errorCode"] == 400004 and "ArgumentInvalid" in body["Message"], body
        assert f"SQL query parse failed due to following errors: {where}" in body["Message"], body
    assert fleet.request("POST", "/devices/query", token, json={"nothing": 1}).status_code == 400
    r = fleet.request("POST", "/devices/query", token, json={"query": "SELECT * FROM devices"}, headers={"x-ms-continuation": "garbage"})
    assert r.status_code == 400
    r = fleet.request("POST", "/devices/query", token, json={"query": "SELECT * FROM devices"}, headers={"x-ms-max-item-count": "ten"})
    assert r.status_code == 400
    # A token of one query is refused for another.
    r = fleet.request("POST", "/devices/query", token, json={"query": "SELECT * FROM devices"}, headers={"x-ms-max-item-count": "1"})
    other = fleet.request("POST", "/devices/query", token, json={"query": "SELECT deviceId FROM devices"},
                          headers={"x-ms-continuation": r.headers["x-ms-continuation"]})
    assert other.status_code == 400
    assert fleet.request("POST", "/devices/query", fleet.device_token("q00001"), json={"query": "SELECT * FROM devices"}).status_code == 401


def read_your_writes(hub, rounds=1000, tag_every=None):
    """A reported patch over MQTT, then right after its 204 a query for it (and every
    `tag_every` rounds a tag written over REST, then a range query for it), `rounds` times."""
    hub.create_device("rw")
    hub.create_device("other")
    client = connect_device(hub, "rw")
    token = hub.token()
    try:
        for i in range(rounds):
            client.publish(f"$iothub/twin/PATCH/properties/reported/?$rid={i}", json.dumps({"n": i}).encode())
            ptype, _, body = client.read()
            assert ptype == PUBLISH and b"res/204/" in body, body[:80]
            r = hub.request("POST", "/devices/query", token,
                            json={"query": f"SELECT deviceId FROM devices WHERE properties.reported.n = {i}"})
            assert r.status_code == 200 and r.json() == [{"deviceId": "rw"}], (i, r.text)
            if tag_every and i % tag_every == 0:
                hub.set_tags("other", {"k": i})
                r = hub.request("POST", "/devices/query", token,
                                json={"query": f"SELECT deviceId FROM devices WHERE tags.k >= {i} AND tags.k < {i + 1}"})
                assert r.status_code == 200 and r.json() == [{"deviceId": "other"}], (i, r.text)
    finally:
        client.close()


def test_a_query_sees_every_acknowledged_write(hub):
    read_your_writes(hub)


def test_indexed_paths_see_every_acknowledged_write(tmp_path):
    """The same 1,000 rounds with `properties.reported.n` declared in `[query] indexed_paths`
    (so the query reads the index entry written in the reported patch's own batch), and
    twin tag writes (always indexed) read back right after their 200."""
    config = tmp_path / "index.toml"
    config.write_text('[query]\nindexed_paths = ["properties.reported.n"]\n')
    hub = Hub(tmp_path / "hub").start(["--config", str(config)])
    try:
        read_your_writes(hub, tag_every=10)
    finally:
        hub.kill()
