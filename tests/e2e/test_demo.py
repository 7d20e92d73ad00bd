"""`goodput demo` end to end on the tiny model: every component starts, the replay is measured by
the sidecar, and the report agrees with what the client saw."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support import free_port, goodput_command


@pytest.mark.slow
def test_demo_runs_the_whole_stack_and_writes_a_report(tmp_path):
    ports = [str(free_port()) for _ in range(4)]
    proc = subprocess.run(goodput_command("demo", "--model", "tiny", "--duration", "8", "--out", str(tmp_path),
                                          "--engine-port", ports[0], "--sidecar-port", ports[1],
                                          "--forecaster-port", ports[2], "--forecaster-api-port", ports[3]),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    summary, final = report["summary"], report["final_metrics"]
    records = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert summary["requests"] == len(records) >= 2 and summary["errors"] == 0
    # The live view reads the sidecar's counters: it must have counted every request the client sent
    # (calibration adds 5 more: one warm-up and four timed).
    assert final["requests_done"] == summary["requests"] + 5
    # The forecaster ran and published a decision.
    assert final["desired_replicas"] >= 1
    assert f"http://127.0.0.1:{ports[1]}/metrics" in proc.stdout
