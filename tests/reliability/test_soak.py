"""`goodput bench soak`: a very short run end to end, and its leak arithmetic on known samples."""

from __future__ import annotations

import json
import subprocess

import pytest

from goodput_cli.soak import Sample, SoakResult, judge, slope_per_minute
from tests.support import goodput_command


def _samples(mib_per_minute: float, n: int = 30) -> list[Sample]:
    return [Sample(t=10.0 * i, rss_mib=40 + mib_per_minute * (10.0 * i / 60), open_fds=20, threads=2,
                   asyncio_tasks=3, in_flight=0) for i in range(n)]


def test_slope_is_the_least_squares_rss_growth_after_warm_up():
    # A first fifth that jumps (start-up allocations) is left out of the fit.
    samples = _samples(0.5)
    for s in samples[:6]:
        s.rss_mib -= 30
    assert slope_per_minute(samples) == pytest.approx(0.5)


def test_a_leaking_run_fails_and_a_flat_one_passes():
    for slope, ok in ((0.0, True), (3.0, False)):
        result = SoakResult(minutes=30, rate=4, samples=_samples(slope), client={"good": 100},
                            sidecar={"finished": 100, "arrived": 100, "desired_replicas": 1})
        checks = {c.name: c.ok for c in judge(result, result.samples[0], result.samples[-1])}
        assert checks["RSS slope, MiB/min"] is ok
    result.sidecar["finished"] = 99       # one request lost from the sidecar's count
    assert not {c.name: c.ok for c in judge(result, result.samples[0], result.samples[-1])}["sidecar counted / client sent"]


@pytest.mark.slow
def test_a_short_soak_passes_with_every_request_counted(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run(goodput_command("bench", "soak", "--minutes", "0.2", "--rate", "4", "--json", str(out)),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert all(c["ok"] for c in doc["checks"]), doc["checks"]
    sent = sum(doc["client"].values())
    assert sent == 48 and doc["sidecar"]["finished"] == sent        # 4/s x 12 s
    assert len(doc["samples"]) >= 5
    assert "soak: PASS" in proc.stdout
