"""Online backup against offline backup of the same hub: how long `ferrohub backup` takes while
the hub serves a mixed load (MQTT telemetry, twin patches, C2D, registry writes), and how long
the same command takes on the stopped hub. Prints medians of --repeat runs of each.

    python bench/online_backup.py --bin $FERROHUB_BIN [--seconds 10] [--repeat 5]

Run it in its own network namespace (`unshare -n`, `ip link set lo up`); the hub listens on
loopback ephemeral ports."""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
import crashmatrix as cm  # noqa: E402
from hubkit import Hub  # noqa: E402


def timed_backup(binary, data_dir, to):
    started = time.monotonic()
    out = subprocess.run([binary, "backup", "--data-dir", str(data_dir), "--to", str(to)],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return time.monotonic() - started


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("FERROHUB_BIN"))
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    os.environ["FERROHUB_BIN"] = args.bin
    work = Path(tempfile.mkdtemp(prefix="online-backup-"))
    hub = Hub(work / "hub").start()
    for d in ("tel-1", "tel-2", "twin-1", "c2d-1"):
        hub.create_device(d)
    ledger, stop = cm.Ledger(), threading.Event()
    loads = [(cm.mqtt_telemetry, "tel-1"), (cm.mqtt_telemetry, "tel-2"), (cm.twin_patches, "twin-1"),
             (cm.c2d_sender, "c2d-1"), (cm.c2d_receiver, "c2d-1"), (cm.registry_writer, "reg")]
    threads = [threading.Thread(target=f, args=(hub, ledger, stop, a)) for f, a in loads]
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    online = [timed_backup(args.bin, hub.data_dir, work / f"online-{i}") for i in range(args.repeat)]
    stop.set()
    for t in threads:
        t.join(timeout=30)
    hub.stop()
    offline = [timed_backup(args.bin, hub.data_dir, work / f"offline-{i}") for i in range(args.repeat)]
    size = sum(f.stat().st_size for f in (hub.data_dir / "db").rglob("*") if f.is_file())
    print(f"database {size / 1e6:.1f} MB; {len(ledger.telemetry_acked)} telemetry messages acknowledged in all")
    print(f"online backup  median {statistics.median(online):.3f} s  (runs: {', '.join(f'{t:.3f}' for t in online)})")
    print(f"offline backup median {statistics.median(offline):.3f} s  (runs: {', '.join(f'{t:.3f}' for t in offline)})")
    print(f"ratio online/offline {statistics.median(online) / statistics.median(offline):.2f}")


if __name__ == "__main__":
    main()
