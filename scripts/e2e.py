"""Runs the end-to-end suites (tests/python) as independent groups side by side and says how
each went (docs/testing.md).

    python scripts/e2e.py --out DIR [--full] [--groups N] [--serial] [--record-durations]
                          [--only MODULE ...]

What runs comes from tests/python/suites.toml: every single-node module (the `full_only` ones
with --full), the cluster modules, and the single-node modules rerun against a three-node
cluster (FERROHUB_TEST_CLUSTER=1). The modules are spread over N groups by their measured
durations (tests/python/durations.json; longest first onto the least loaded group), so the same
checkout always makes the same groups.

Each group runs as root in network and PID namespaces of its own (`unshare`), so the SDKs'
fixed ports and the cluster's 127.0.0.2-4 never collide between groups, and every process a
group started ends with it (the kernel stops a PID namespace's processes when its first one
exits; what is still running is named first, as a leak). Without root the groups run one after
another in this namespace, each in a process group that is killed when it ends.

Each group writes DIR/<group>.log (pytest's whole output, with the hub log tails of failed
tests) and DIR/<group>.xml (JUnit). This prints a line per group as it ends, the output of
failed groups, the slowest tests, and appends one row per group to DIR/phases.tsv for the
test command's table. The exit status is 1 when any group failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITES = REPO / "tests" / "python"
DURATIONS = SUITES / "durations.json"
# A module never measured is assumed to take this long (seconds) when groups are balanced.
UNMEASURED = 30.0
# A group that runs longer than this is stopped and fails (pytest-timeout names a hung test
# first: each test has its own limit in tests/python/pytest.ini).
GROUP_LIMIT_S = 40 * 60

# Runs inside the group's namespaces as their first process: brings loopback up, runs pytest,
# then names and stops whatever is still running (a leak from a test).
NAMESPACE_INIT = r"""
ip link set lo up || exit 97
"$@"
rc=$?
leaks=""
for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = 1 ] && continue
    exe=""
    IFS= read -r -d '' exe <"$p/cmdline" 2>/dev/null
    [ -n "$exe" ] && leaks+="  pid $pid: $exe"$'\n'
done
if [ -n "$leaks" ]; then
    echo "== processes still running when the group ended (a test's leak; stopped now):"
    printf '%s' "$leaks"
    kill -9 -1 2>/dev/null
fi
exit $rc
"""

@dataclass
class Item:
    """One module in one mode: `key` is the module's file name, prefixed `cluster:` for a rerun
    against a cluster."""

    key: str
    seconds: float

    @property
    def module(self) -> str:
        return self.key.split(":", 1)[-1]

    @property
    def on_cluster(self) -> bool:
        return self.key.startswith("cluster:")


@dataclass
class Group:
    name: str
    items: list[Item] = field(default_factory=list)
    started: float = 0.0
    seconds: float = 0.0
    status: str = "not run"
    counts: dict = field(default_factory=dict)

    @property
    def expected(self) -> float:
        return sum(i.seconds for i in self.items)


def plan(full: bool, only: list[str]) -> list[Item]:
    suites = tomllib.loads((SUITES / "suites.toml").read_text())
    single, cluster = suites["single_node"], suites["cluster"]
    own = cluster["own"] + (cluster["own_full_only"] if full else [])
    never_single = set(cluster["own"]) | set(cluster["own_full_only"])
    if not full:
        never_single |= set(single["full_only"])
    modules = sorted(p.name for p in SUITES.glob("test_*.py"))
    listed = set(own) | set(cluster["rerun"]) | set(cluster["rerun_full_only"]) | set(single["full_only"])
    unknown = listed - set(modules)
    if unknown:
        sys.exit(f"tests/python/suites.toml names modules that do not exist: {sorted(unknown)}")
    keys = [m for m in modules if m not in never_single] + own
    keys += [f"cluster:{m}" for m in cluster["rerun"] + (cluster["rerun_full_only"] if full else [])]
    if only:
        keys = [k for k in keys if k in only or k.split(":", 1)[-1] in only]
    measured = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    return [Item(k, float(measured.get(k, UNMEASURED))) for k in keys]


def balance(items: list[Item], n: int) -> list[Group]:
    """Longest first onto the least loaded group; ties go to the lower-numbered group."""
    groups = [Group(f"e2e-{i + 1}") for i in range(n)]
    for item in sorted(items, key=lambda i: (-i.seconds, i.key)):
        min(groups, key=lambda g: g.expected).items.append(item)
    return [g for g in groups if g.items]


def pytest_commands(group: Group, out: Path, python: str) -> list[tuple[list[str], dict]]:
    """One pytest run for the group's single-node modules and one, with the cluster switch, for
    its reruns: each with its own temporary directory and JUnit file."""
    runs = []
    for on_cluster in (False, True):
        modules = [str(SUITES / i.module) for i in group.items if i.on_cluster == on_cluster]
        if not modules:
            continue
        tag = f"{group.name}{'-cluster' if on_cluster else ''}"
        env = {"FERROHUB_TEST_CLUSTER": "1" if on_cluster else "0",
               # The console tests' screenshots go with the run, not into docs/console/ (set it
               # to docs/console to refresh those).
               "FERROHUB_CONSOLE_SHOTS": os.environ.get("FERROHUB_CONSOLE_SHOTS", str(out / "console-shots" / tag)),
               "FERROHUB_TEST_SEED": os.environ["FERROHUB_TEST_SEED"]}
        cmd = [python, "-m", "pytest", "-q", "-c", str(SUITES / "pytest.ini"), "--durations=25",
               f"--basetemp={out / 'tmp' / tag}", f"--junitxml={out / (tag + '.xml')}",
               "-o", f"junit_suite_name={tag}", *modules]
        runs.append((cmd, env))
    return runs


def group_script(group: Group, out: Path, python: str) -> str:
    """The shell commands a group runs: its pytest runs one after another; the status is the
    first failure's."""
    lines = ["rc=0"]
    for cmd, env in pytest_commands(group, out, python):
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        lines.append(f"env {assigns} {shlex.join(cmd)} || rc=$?")
    lines.append("exit $rc")
    return "\n".join(lines)


def launch(group: Group, out: Path, python: str, namespaces: bool) -> subprocess.Popen:
    script = group_script(group, out, python)
    if namespaces:
        # Inside, /proc/1 is the group's own init, in the group's network namespace: tests
        # cannot tell from /proc that they are isolated already, so they are told.
        script = f"export FERROHUB_OWN_NETNS=1\n{script}"
        cmd = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--", "bash", "-c", NAMESPACE_INIT,
               "init", "bash", "-c", script]
    else:
        cmd = ["bash", "-c", script]
    cmd = ["timeout", "--signal=TERM", "--kill-after=60", str(GROUP_LIMIT_S), *cmd]
    log = open(out / f"{group.name}.log", "w")
    log.write(f"== {group.name}: {' '.join(i.key for i in group.items)}\n")
    log.flush()
    group.started = time.time()
    # A session of its own: whatever the group leaves behind is killed with its process group.
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)


def junit_cases(out: Path, group: Group) -> list[dict]:
    cases = []
    for path in sorted(out.glob(f"{group.name}*.xml")):
        on_cluster = path.stem.endswith("-cluster")
        try:
            root = ET.parse(path).getroot()
        except (ET.ParseError, OSError):
            continue
        for case in root.iter("testcase"):
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                if case.find(tag) is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
            module = case.get("classname", "").split(".")[0] + ".py"
            cases.append({"module": f"cluster:{module}" if on_cluster else module,
                          "name": case.get("name", ""), "seconds": float(case.get("time", 0) or 0),
                          "outcome": outcome})
    return cases


def finish(group: Group, proc: subprocess.Popen, out: Path) -> None:
    rc = proc.returncode
    group.seconds = time.time() - group.started
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    cases = junit_cases(out, group)
    counts = {}
    for c in cases:
        counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
    group.counts = counts
    if rc == 124 or rc == 137:
        group.status = f"failed (stopped after {GROUP_LIMIT_S // 60} min)"
    elif rc != 0 or counts.get("failed") or counts.get("error"):
        group.status = "failed"
    else:
        group.status = "passed"


def summary(group: Group) -> str:
    c = group.counts
    parts = [f"{c[k]} {k}" for k in ("passed", "failed", "error", "skipped") if c.get(k)]
    return f"{group.name:<8} {group.status:<7} {group.seconds:7.1f} s  {', '.join(parts) or 'no tests reported'}"


def failure_text(log: Path) -> str:
    """A failed group's output from pytest's first failure report (or the whole log if none)."""
    text = log.read_text(errors="replace")
    for marker in ("= FAILURES =", "= ERRORS ="):
        at = text.find(marker)
        if at >= 0:
            return text[text.rfind("\n", 0, at) + 1:]
    return text[-20000:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--serial", action="store_true", help="one group at a time, in this namespace")
    ap.add_argument("--record-durations", action="store_true",
                    help="write the measured module durations to tests/python/durations.json")
    ap.add_argument("--only", nargs="*", default=[], help="modules to run (file names)")
    ap.add_argument("--table", type=Path, help="append one row per group to this file (default: OUT/phases.tsv)")
    args = ap.parse_args()

    out = args.out.resolve()
    (out / "tmp").mkdir(parents=True, exist_ok=True)
    python = sys.executable
    namespaces = not args.serial and os.geteuid() == 0
    if not namespaces and not args.serial:
        print("e2e: not root, so no network namespaces: the groups run one after another", flush=True)
    # One seed for every random choice the suites make (the crash matrix's moments), printed so a
    # failing run can be replayed with FERROHUB_TEST_SEED.
    os.environ.setdefault("FERROHUB_TEST_SEED", str(random.randrange(1 << 30)))
    print(f"e2e: test seed {os.environ['FERROHUB_TEST_SEED']} (replay: FERROHUB_TEST_SEED={os.environ['FERROHUB_TEST_SEED']})", flush=True)
    items = plan(args.full, args.only)
    groups = balance(items, args.groups if namespaces else 1)
    for g in groups:
        print(f"{g.name}: {len(g.items)} modules, about {g.expected / 60:.1f} min measured: "
              + " ".join(i.key for i in g.items), flush=True)

    running: dict[str, tuple[Group, subprocess.Popen]] = {}
    pending = list(groups)
    while pending or running:
        while pending and (namespaces or not running):
            g = pending.pop(0)
            running[g.name] = (g, launch(g, out, python, namespaces))
        time.sleep(0.5)
        for name, (g, proc) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[name]
            finish(g, proc, out)
            print(summary(g), flush=True)

    failed = [g for g in groups if g.status != "passed"]
    for g in failed:
        print(f"\n======== {g.name} failed: its output from the first failure (all of it in {out / (g.name + '.log')})")
        print(failure_text(out / f"{g.name}.log"), flush=True)

    cases = [c for g in groups for c in junit_cases(out, g)]
    print("\nslowest tests:")
    for c in sorted(cases, key=lambda c: -c["seconds"])[:25]:
        print(f"  {c['seconds']:7.1f} s  {c['module']}::{c['name']}")
    per_module: dict[str, float] = {}
    for c in cases:
        per_module[c["module"]] = per_module.get(c["module"], 0.0) + c["seconds"]
    (out / "module-durations.json").write_text(json.dumps(dict(sorted(per_module.items())), indent=1) + "\n")
    if args.record_durations:
        # Only modules that passed whole: a failure's time says little about the next run's.
        broken = {c["module"] for c in cases if c["outcome"] in ("failed", "error")}
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        known.update({k: round(v, 1) for k, v in per_module.items() if k not in broken})
        DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")
        print(f"recorded {len(per_module)} module durations in {DURATIONS.relative_to(REPO)}")

    with open(args.table or out / "phases.tsv", "a") as table:
        for g in groups:
            c = g.counts
            detail = f"{c.get('passed', 0)} passed, {c.get('failed', 0) + c.get('error', 0)} failed"
            broken = [f"{x['module']}::{x['name']}" for x in junit_cases(out, g) if x["outcome"] in ("failed", "error")]
            if broken:
                detail += ": " + " ".join(broken[:3]) + (" ..." if len(broken) > 3 else "")
            table.write(f"{g.name}\t{g.status}\t{g.seconds:.0f}\t{detail}; {len(g.items)} modules\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
