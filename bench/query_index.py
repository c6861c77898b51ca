"""Twin query latency with and without the index, and scheduled twin-job throughput (issue 15).

N devices imported by an import job, each with tags {site: "s<i%100>", n: i, grp: i%10} and
desired {x: i%100, site: "s<i%100>"}: `tags.site` is indexed (every tag is), the same value
under `properties.desired.site` is not, so the two equal-selectivity queries are a peer pair.
Timed (median and max of 9, one request each, page size 1000): an indexed equality (1%), an
indexed range (1%), an indexed COUNT, a GROUP BY over every twin, and the unindexed equality
(a full scan). Then a scheduleUpdateTwin job over every device: devices per second from
creation to `completed`.

Usage: query_index.py FERROHUB_BIN WORKDIR N OUT_JSON
Bounded: fixed counts; every wait has a limit.
"""
import json, os, statistics, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
binary, work, n, out = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ["FERROHUB_BIN"] = binary

from hubkit import Hub  # noqa: E402
from jobkit import import_devices  # noqa: E402

work.mkdir(parents=True, exist_ok=True)
hub = Hub(work / "hub").start()
try:
    started = time.perf_counter()
    import_devices(hub, work, ({"id": f"s{i:07d}", "tags": {"site": f"s{i % 100}", "n": i, "grp": i % 10},
                                "properties": {"desired": {"x": i % 100, "site": f"s{i % 100}"}}} for i in range(n)))
    import_s = time.perf_counter() - started
    token = hub.token()

    def timed(query, rows):
        runs = []
        for _ in range(9):
            t = time.perf_counter()
            r = hub.request("POST", "/devices/query", token, json={"query": query},
                            headers={"x-ms-max-item-count": "1000"})
            runs.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
            assert len(r.json()) == rows, (query, len(r.json()))
        return {"median_ms": round(statistics.median(runs) * 1000, 2), "max_ms": round(max(runs) * 1000, 2)}

    share = n // 100
    report = {"twins": n, "import_s": round(import_s, 1), "queries": {
        "indexed equality tags.site = 's42' (1%)": timed("SELECT * FROM devices WHERE tags.site = 's42'", min(share, 1000)),
        "unindexed equality properties.desired.site = 's42' (1%, full scan)":
            timed("SELECT * FROM devices WHERE properties.desired.site = 's42'", min(share, 1000)),
        "indexed range tags.n in [n/2, n/2 + 1%)":
            timed(f"SELECT * FROM devices WHERE tags.n >= {n // 2} AND tags.n < {n // 2 + share}", min(share, 1000)),
        "indexed COUNT() WHERE tags.site = 's42'":
            timed("SELECT COUNT() AS n FROM devices WHERE tags.site = 's42'", 1),
        "GROUP BY tags.grp (every twin)": timed("SELECT tags.grp AS g, COUNT() AS n FROM devices GROUP BY tags.grp", 10),
    }}
    t = time.perf_counter()
    r = hub.request("PUT", "/jobs/v2/bench-all", token, json={
        "jobId": "bench-all", "type": "scheduleUpdateTwin", "queryCondition": "*",
        "updateTwin": {"tags": {"patched": True}}, "maxExecutionTimeInSeconds": 3600})
    assert r.status_code == 200, r.text
    deadline = time.time() + 1800
    while True:
        job = hub.request("GET", "/jobs/v2/bench-all", token).json()
        if job["status"] in ("completed", "failed", "cancelled") or time.time() > deadline:
            break
        time.sleep(0.2)
    elapsed = time.perf_counter() - t
    assert job["status"] == "completed" and job["deviceJobStatistics"]["succeededCount"] == n, job
    report["twin job over every device"] = {"seconds": round(elapsed, 2), "devices_per_s": round(n / elapsed)}
finally:
    hub.kill()
Path(out).write_text(json.dumps(report, indent=2))
print(json.dumps(report, indent=2))
