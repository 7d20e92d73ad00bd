"""The sweep step of scripts/gpu_check.sh: engine -> sidecar -> `goodput sweep`, then whether
throughput still rises past the goodput knee (the SLO gives out before the engine does).

python scripts/gpu_check_sweep.py --model M --device D --rates 2,4,8 --duration 10 --out DIR
Prints one verdict line and writes DIR/sweep.json (the sweep's own report) and DIR/knee.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from goodput_cli.procs import ServerProcess, goodput_command  # noqa: E402
from tests.support import free_port  # noqa: E402


def past_knee(doc: dict) -> dict:
    """Throughput at the knee and at the higher offered rates."""
    knee = doc.get("knee")
    points = sorted(doc["points"], key=lambda p: p["rate"])
    if knee is None:
        return {"knee_rate": None, "rising_past_knee": False, "note": "no rate met the objective: no knee"}
    at = next(p for p in points if p["rate"] == knee["rate"])
    after = [p for p in points if p["rate"] > knee["rate"]]
    best_after = max((p["achieved_rate"] for p in after), default=None)
    return {"knee_rate": knee["rate"], "throughput_at_knee": at["achieved_rate"],
            "throughput_after": [(p["rate"], p["achieved_rate"], p["goodput"], p["attainment"]) for p in after],
            "rising_past_knee": best_after is not None and best_after > at["achieved_rate"] * 1.05,
            "note": "no rate above the knee was offered" if not after else ""}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--rates", required=True)
    ap.add_argument("--duration", default="10")
    ap.add_argument("--slo-ttft", default="1.0")
    ap.add_argument("--slo-tpot", default="0.05")
    ap.add_argument("--input-tokens", default="128")
    ap.add_argument("--output-tokens", default="64")
    ap.add_argument("--max-num-seqs", default="128")
    ap.add_argument("--kv-cache-memory", default="2GiB")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    engine_port, sidecar_port = free_port(), free_port()
    engine = ServerProcess(goodput_command("engine", "serve", "--model", a.model, "--device", a.device, "--dtype", a.dtype,
                                           "--port", str(engine_port), "--max-num-seqs", a.max_num_seqs,
                                           "--kv-cache-memory", a.kv_cache_memory, "--max-model-len", "2048"),
                           f"http://127.0.0.1:{engine_port}/health", timeout=300, name="engine")
    try:
        sidecar = ServerProcess(goodput_command("sidecar", "run", "--upstream", f"http://127.0.0.1:{engine_port}",
                                                "--port", str(sidecar_port)),
                                f"http://127.0.0.1:{sidecar_port}/healthz", timeout=60, name="sidecar")
        try:
            sweep = a.out / "sweep-report"
            r = subprocess.run(goodput_command("sweep", "--url", f"http://127.0.0.1:{sidecar_port}", "--rates", a.rates,
                                               "--duration", a.duration, "--input-tokens", a.input_tokens,
                                               "--output-tokens", a.output_tokens, "--slo-ttft", a.slo_ttft,
                                               "--slo-tpot", a.slo_tpot, "--quiet", "--out", str(sweep)),
                               capture_output=True, text=True, timeout=900)
            print(r.stdout[-3000:])
            if r.returncode != 0:
                print(r.stderr[-3000:], file=sys.stderr)
                return r.returncode
        finally:
            sidecar.stop()
    finally:
        engine.stop()
        print("engine log tail:\n" + engine.log()[-1500:])
    doc = json.loads((sweep / "sweep.json").read_text())
    verdict = past_knee(doc)
    (a.out / "knee.json").write_text(json.dumps(verdict, indent=1))
    print(f"sweep verdict: knee {verdict['knee_rate']} req/s, throughput still rising past it: "
          f"{verdict['rising_past_knee']} {verdict['note']}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
