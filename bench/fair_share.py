"""Fair-share figures (THR-2): a hub with a D2C budget of RATE/s (default 120), 99 devices sending
one QoS 1 message a second each and 1 device flooding for DURATION seconds (default 30).

Usage: fair_share.py FERROHUB_BIN WORKDIR OUT_JSON
Prints and writes: the quiet devices' PUBACK latency percentiles and the share acknowledged
within 1 s, the flooder's acknowledged rate, disconnects and refused CONNECTs. Bounded: every
loop stops at the deadline.
"""
import json, os, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
binary, work, out = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
os.environ["FERROHUB_BIN"] = binary

from d2cload import Flooder, Quiet, Window  # noqa: E402
from hubkit import Hub  # noqa: E402

RATE = int(os.environ.get("RATE", "120"))
DURATION = int(os.environ.get("DURATION", "30"))
work.mkdir(parents=True, exist_ok=True)
config = work / "hub.toml"
config.write_text(f'[throttling]\ntier = "s1"\nd2c_sends_per_second = {RATE}\nregistry_per_minute = 5000\nfair_share_hold = "3s"\n')
hub = Hub(work / "hub").start(["--config", str(config)])
try:
    quiet_ids = [f"quiet-{i}" for i in range(99)]
    for d in quiet_ids + ["flooder"]:
        hub.create_device(d)
    window = Window(len(quiet_ids) + 1, DURATION)
    quiet = [Quiet(hub, d, window) for d in quiet_ids]
    flooder = Flooder(hub, "flooder", window)
    for t in quiet + [flooder]:
        t.start()
    for t in quiet + [flooder]:
        t.join(DURATION + 150)
finally:
    hub.kill()

lat = sorted(x for t in quiet for x in t.latencies)
failures = sum(len(t.failures) for t in quiet)
sends = len(lat) + failures
pct = lambda p: lat[min(len(lat) - 1, int(p / 100 * len(lat)))] * 1000 if lat else None
report = {
    "budget_per_s": RATE, "duration_s": DURATION, "quiet_devices": 99,
    "quiet_sends": sends, "quiet_failures": failures,
    "quiet_within_1s": sum(1 for x in lat if x <= 1.0) / sends if sends else 0,
    "quiet_puback_ms": {"p50": pct(50), "p99": pct(99), "max": lat[-1] * 1000 if lat else None},
    "flooder_acked": flooder.acked, "flooder_acked_per_s": flooder.acked / DURATION,
    "flooder_disconnects": flooder.disconnects, "flooder_refused_connects": flooder.refused_connects,
}
Path(out).write_text(json.dumps(report, indent=2))
print(f"fair share, budget {RATE}/s, {DURATION} s: quiet devices {sends} sends, "
      f"{report['quiet_within_1s'] * 100:.2f}% acknowledged within 1 s, PUBACK p50 {pct(50):.1f} ms, "
      f"p99 {pct(99):.1f} ms, max {lat[-1] * 1000:.1f} ms; flooder {flooder.acked} acknowledged "
      f"({report['flooder_acked_per_s']:.1f}/s), {flooder.disconnects} disconnects, "
      f"{flooder.refused_connects} CONNECTs refused")
