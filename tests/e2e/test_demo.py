"""`goodput demo` end to end on the tiny model: every component starts, the three phases are
measured by the sidecar, the report's figures add up and equal the sidecar's own counters, and
no process outlives the demo, however it ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from forecaster.replay import read_recording
from tests.support import free_port, goodput_command

PHASES = "under:0.5:6,burst:2:5,recovery:0.4:6"


def _demo_cmd(tmp_path, ports):
    return goodput_command("demo", "--model", "tiny", "--phases", PHASES, "--max-rate", "12", "--out", str(tmp_path),
                           "--engine-port", ports[0], "--sidecar-port", ports[1],
                           "--forecaster-port", ports[2], "--forecaster-api-port", ports[3])


def _descendants_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.2)
    return alive


@pytest.mark.slow
def test_demo_phases_add_up_to_the_sidecars_counters(tmp_path):
    ports = [str(free_port()) for _ in range(4)]
    t0 = time.monotonic()
    proc = subprocess.run(_demo_cmd(tmp_path, ports), capture_output=True, text=True, timeout=300)
    print(f"goodput demo --model tiny took {time.monotonic() - t0:.0f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    records = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    phases = report["phases"]
    assert [p["name"] for p in phases] == ["under", "burst", "recovery"]
    # Every request in exactly one phase, by its planned arrival.
    for r in records:
        assert sum(p["start"] <= r["scheduled"] < p["end"] for p in phases) == 1, r
    assert sum(p["requests"] for p in phases) == len(records) == report["requests"] > 0
    for p in phases:
        mine = [r for r in records if r["slo_class"] == f"phase-{p['name']}"]
        assert len(mine) == p["requests"]
        assert p["good"] + p["slo_violated"] + p["shed"] + p["errors"] == p["requests"]
        assert p["errors"] == 0
        # The client's outcomes equal the sidecar's counters for the phase's class.
        counted = report["sidecar_counts"][f"phase-{p['name']}"]
        assert sum(counted.values()) == p["requests"]
        assert counted.get("good", 0) == p["good"] and counted.get("slo_violated", 0) == p["slo_violated"]
        assert p["attainment"] == pytest.approx(p["good"] / p["requests"])
    # The offered rates keep the phases' ratios.
    assert phases[1]["offered_rate"] > phases[0]["offered_rate"] > phases[2]["offered_rate"]
    assert "forecast_lead_seconds" in report and report["calibration"]["capacity_req_per_s"] > 0
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "report.md").read_text()
    assert all(f"**{name}**" in md for name in ("under", "burst", "recovery"))
    assert f"http://127.0.0.1:{ports[1]}/metrics" in proc.stdout and "goodput-slo.json" in proc.stdout
    # Each process's log and every step the forecaster read lie in the report folder; the steps replay.
    assert all((tmp_path / f"{name}.log").stat().st_size > 0 for name in ("engine", "sidecar", "forecaster"))
    steps = list(read_recording(tmp_path / "forecaster-steps.jsonl"))
    assert len(steps) >= 5 and all(not s.get("warm") for s in steps)
    assert steps[-1]["sample"].arrivals_total > steps[0]["sample"].arrivals_total
    # Every calibration request, by stage, so the calibration's fit can be read again.
    cal = [json.loads(x) for x in (tmp_path / "calibration-records.jsonl").read_text().splitlines()]
    stages = [c["stage"] for c in cal]
    assert stages[:3] == ["warm-up", "prefill-short", "prefill-long"]
    assert stages.count("decode-8") == 8 and stages.count("decode-32") == 32
    assert {"operating-1", "operating-2"} <= set(stages)
    assert all(c["slo_class"] == "calibrate" and c["ttft"] > 0 for c in cal)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_process_outlives_the_demo(tmp_path, sig):
    """Ctrl-C and SIGTERM run the demo's own clean-up; SIGKILL skips it, and the kernel ends the components
    (each asked for SIGTERM when its parent dies)."""
    if sig == signal.SIGKILL and not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's prctl")
    ports = [str(free_port()) for _ in range(4)]
    demo = subprocess.Popen(_demo_cmd(tmp_path, ports), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        for line in demo.stdout:
            if line.startswith("replaying") or time.monotonic() > deadline:
                break
        children = [c.pid for c in psutil.Process(demo.pid).children(recursive=True)]
        assert len(children) >= 3, children        # engine, sidecar, forecaster
        time.sleep(1.0)
        demo.send_signal(sig)
        demo.wait(60)
        assert _descendants_gone(children) == []
    finally:
        if demo.poll() is None:
            demo.kill()
        demo.stdout.close()
