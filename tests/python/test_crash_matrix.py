"""The crash matrix's CI smoke (issue 18, part 5): 3 SIGKILL trials under mixed load, each
followed by a restart and a check of every acknowledged operation (see crashmatrix.py; the full
run of 50 trials is `python tests/python/crashmatrix.py --trials 50`, outside CI)."""

import io
import json
import random

from crashmatrix import run


def test_three_sigkill_trials_lose_nothing_acknowledged_and_half_apply_nothing():
    out = io.StringIO()
    reports = run(3, random.randrange(1 << 30), out)
    assert [r["problems"] for r in reports] == [[], [], []], out.getvalue()
    # The load really ran: each trial had acknowledged writes of every kind to lose.
    for r in reports:
        assert r["telemetry_acked"] > 0 and r["devices_acked"] > 0, json.dumps(r)
    assert sum(r["twin_acked"] for r in reports) > 0
    assert sum(r["c2d_acked"] for r in reports) > 0
