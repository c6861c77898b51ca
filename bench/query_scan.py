"""What a twin query costs without an index (QRY-1): N devices with tags imported by an import
job, then, timed (median of 5): the first page of `SELECT *` (100 rows), a selective query that
matches one twin (a full scan), `SELECT COUNT()` (a full scan) and a GROUP BY over a tag.

Usage: query_scan.py FERROHUB_BIN WORKDIR N OUT_JSON
Bounded: fixed counts; every wait has a limit.
"""
import json, os, statistics, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
binary, work, n, out = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ["FERROHUB_BIN"] = binary

from hubkit import Hub  # noqa: E402
from jobkit import file_uri, wait_job, write_lines  # noqa: E402

work.mkdir(parents=True, exist_ok=True)
write_lines(work / "in" / "devices.txt", ({"id": f"s{i:07d}", "tags": {"k": i, "grp": i % 10}} for i in range(n)))
hub = Hub(work / "hub").start()
try:
    token = hub.token()
    r = hub.request("POST", "/jobs/create", token, json={"type": "import", "inputBlobContainerUri": file_uri(work / "in"),
                                                          "outputBlobContainerUri": file_uri(work / "out")})
    wait_job(lambda j: hub.request("GET", f"/jobs/{j}", token).json(), r.json()["jobId"], timeout=1800)

    def timed(query):
        runs = []
        for _ in range(5):
            t = time.perf_counter()
            r = hub.request("POST", "/devices/query", token, json={"query": query})
            runs.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
        return statistics.median(runs) * 1000

    report = {"twins": n, "median_ms": {
        "first page of SELECT * (100 rows)": timed("SELECT * FROM devices"),
        "one twin by tag (full scan)": timed(f"SELECT * FROM devices WHERE tags.k = {n // 2}"),
        "COUNT() (full scan)": timed("SELECT COUNT() AS n FROM devices"),
        "GROUP BY tags.grp (full scan)": timed("SELECT tags.grp AS g, COUNT() AS n FROM devices GROUP BY tags.grp"),
    }}
finally:
    hub.kill()
Path(out).write_text(json.dumps(report, indent=2))
print(json.dumps(report, indent=2))
