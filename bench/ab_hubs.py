"""Two ferrohub builds side by side with the shared yardstick (`../shared/tools/mqttload`):
the A/B runs that decide whether a change is kept (issue 19).

Each build gets its own data directory with the same devices (imported, one SAS key for all),
is restarted after the import, and both stay running; then one scenario of `yardstick.py` runs
against A and B in turn, A B A B ..., REPEAT times. Printed: each run's figures, the medians,
and the ratio B/A of each figure pair by pair with its median, so a comparison holds while the
machine's speed drifts. Bounded: every mqttload run has a fixed duration.

Usage: ab_hubs.py HUB_A HUB_B MQTTLOAD WORKDIR SCENARIO [REPEAT (default 5)]
DEVICES (default 1000) sets how many devices each hub holds; a scenario needs at least as many
as it opens connections.
"""
import base64
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from hubkit import Hub  # noqa: E402
from jobkit import import_devices  # noqa: E402
from yardstick import figures, median, raise_nofile, run_mqttload, scenarios, write_creds  # noqa: E402

KEY = base64.b64encode(b"b" * 32).decode()


def start(binary, data, config):
    os.environ["FERROHUB_BIN"] = binary
    return Hub(data).start(["--config", str(config)])


def prepare(binary, work, name, devices, config):
    hub = start(binary, work / name, config)
    import_devices(hub, work / f"import-{name}", ({"id": f"b{i:05d}", "authentication": {
        "type": "sas", "symmetricKey": {"primaryKey": KEY, "secondaryKey": KEY}}} for i in range(devices)))
    hub.stop()
    # A fresh process: what the import left in memory must not count.
    return start(binary, work / name, config)


def main():
    hub_a, hub_b, mqttload, work, scenario = sys.argv[1:6]
    repeat = int(sys.argv[6]) if len(sys.argv) > 6 else 5
    devices = int(os.environ.get("DEVICES", "1000"))
    args, _ = scenarios(repeat)[scenario]
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    raise_nofile()
    config = work / "hub.toml"
    config.write_text(f"[listeners]\nmqtt_max_connections = {devices + 500}\n")
    creds = work / "devices.tsv"
    write_creds(creds, devices, KEY)
    hubs = {}
    try:
        for name, binary in (("A", hub_a), ("B", hub_b)):
            hubs[name] = prepare(binary, work, name, devices, config)
        runs = {"A": [], "B": []}
        for rep in range(1, repeat + 1):
            for name, hub in hubs.items():
                r = run_mqttload(mqttload, args, hub.mqtt_port, hub.proc.pid, str(creds),
                                 str(hub.data_dir / "tls" / "ca.pem"), f"{name}/{scenario}/{rep}")
                f = figures(scenario, r) if r else {}
                runs[name].append(f)
                print(f"{name} {scenario} {rep} {f}", file=sys.stderr, flush=True)
    finally:
        for hub in hubs.values():
            hub.stop()
    report(runs)


def report(runs):
    keys = next((f.keys() for f in runs["A"] if f), [])
    print("| figure | A (median) | B (median) | B/A per pair | B/A median |")
    print("|---|---|---|---|---|")
    for k in keys:
        pairs = [(a.get(k), b.get(k)) for a, b in zip(runs["A"], runs["B"])]
        ratios = [b / a for a, b in pairs if a and b]
        ma, mb = median([a for a, _ in pairs]), median([b for _, b in pairs])
        cell = lambda v: f"{v:,.2f}" if v is not None else "-"  # noqa: E731
        print(f"| {k} | {cell(ma)} | {cell(mb)} | {' '.join(f'{r:.3f}' for r in ratios)} | "
              f"{f'{statistics.median(ratios):.3f}' if ratios else '-'} |")


if __name__ == "__main__":
    main()
