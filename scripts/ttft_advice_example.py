"""The README's worked example, reproducible: `python scripts/ttft_advice_example.py --model smollm2`.

A ~1,000-token system prompt with a request id on its second line goes through a sidecar to the
bundled engine (prefix caching on), one request at a time; the sidecar's /advice then says where
the volatile span sits and what moving it would give back. The same requests run again with the
id moved to the end of the system prompt, and the engine's prefix-cache hit rate and the TTFT
measured at the client move; the script prints estimate against measurement. The prompt builder is
the one tests/sidecar/test_advice.py checks (`worked_example`). Results go to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from goodput_cli.procs import ServerProcess, goodput_command  # noqa: E402
from sidecar.timing import StreamTimer  # noqa: E402
from tests.sidecar.test_advice import worked_example  # noqa: E402
from tests.support import free_port  # noqa: E402


def engine_counters(engine: str) -> tuple[float, float]:
    text = httpx.get(engine + "/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            if line.startswith(name + "{"):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values["vllm:prefix_cache_hits_total"], values["vllm:prefix_cache_queries_total"]


def one(client: httpx.Client, url: str, model: str, messages: list[dict], tenant: str = "example") -> tuple[float, int]:
    """TTFT at the client and the engine's cached prompt tokens of one streamed request."""
    body = {"model": model, "messages": messages, "max_tokens": 2, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    start = time.perf_counter()
    timer = StreamTimer(start, "chat")
    with client.stream("POST", url + "/v1/chat/completions", json=body, headers={"x-tenant": tenant}) as r:
        r.raise_for_status()
        for data in r.iter_raw():
            timer.feed(data, time.perf_counter())
    timing = timer.finish(time.perf_counter())
    return timing.ttft, timing.cached_tokens or 0


def phase(client, sidecar: str, engine: str, model: str, n: int, id_at_end: bool, seed: int) -> dict:
    hits0, queries0 = engine_counters(engine)
    runs = [one(client, sidecar, model, worked_example(uuid.uuid4().hex, id_at_end, seed)) for _ in range(n)]
    hits1, queries1 = engine_counters(engine)
    ttfts = [t for t, _ in runs[1:]]           # the first request of a layout has nothing cached yet
    return {"requests": n, "hit_rate": (hits1 - hits0) / (queries1 - queries0),
            "ttft_mean_s": statistics.fmean(ttfts), "ttft_median_s": statistics.median(ttfts),
            "cached_tokens_per_request": statistics.fmean(c for _, c in runs[1:])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="bundled engine model (smollm2 default, tiny for a smoke run)")
    ap.add_argument("--requests", type=int, default=30, help="requests per layout (default 30)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "ttft_advice", help="folder for the JSON result")
    args = ap.parse_args()
    engine_port, sidecar_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    sidecar = f"http://127.0.0.1:{sidecar_port}"
    procs = [ServerProcess(goodput_command("engine", "serve", "--model", args.model, "--port", str(engine_port),
                                           "--max-model-len", "4096"), engine + "/health", timeout=600, name="engine")]
    try:
        procs.append(ServerProcess(goodput_command("sidecar", "run", "--upstream", engine, "--port", str(sidecar_port),
                                                   "--engine-metrics-interval", "1"),
                                   sidecar + "/healthz", timeout=60, name="sidecar"))
        model = httpx.get(engine + "/v1/models").json()["data"][0]["id"]
        with httpx.Client(timeout=600) as client:
            one(client, sidecar, model, [{"role": "user", "content": "Warm up."}], tenant="warm-up")
            before = phase(client, sidecar, engine, model, args.requests, id_at_end=False, seed=0)
            time.sleep(2)                          # one more engine scrape for the prefill rate
            advice = next(g for g in httpx.get(sidecar + "/advice").json()["groups"] if g["tenant"] == "example")
            after = phase(client, sidecar, engine, model, args.requests, id_at_end=True, seed=1)
    finally:
        for p in reversed(procs):
            p.stop()
    share, tokens = advice["span_share"], advice["prompt_tokens_per_request"]
    est_hit_gain = advice["cacheable_tokens_per_request"] * share / tokens if advice["span_offset_tokens"] is not None else 0.0
    est_ttft_gain = (advice["ttft_saving_seconds"] or 0.0) * share
    result = {"model": args.model, "advice": advice, "id_on_line_2": before, "id_at_end": after,
              "estimated": {"hit_rate_gain": est_hit_gain, "ttft_gain_s": est_ttft_gain},
              "measured": {"hit_rate_gain": after["hit_rate"] - before["hit_rate"],
                           "ttft_gain_s": before["ttft_mean_s"] - after["ttft_mean_s"]}}
    for key in ("hit_rate_gain", "ttft_gain_s"):
        est, got = result["estimated"][key], result["measured"][key]
        result["measured"][key.replace("gain", "measured_over_estimated")] = got / est if est else None
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"worked_example_{args.model}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"advice: {advice['advice']}")
    print(f"{'':22} {'id on line 2':>14} {'id at the end':>14} {'estimated':>10} {'measured':>10}")
    print(f"{'prefix-cache hit rate':22} {before['hit_rate']:>14.1%} {after['hit_rate']:>14.1%} "
          f"{'+' + format(est_hit_gain, '.1%'):>10} {'+' + format(result['measured']['hit_rate_gain'], '.1%'):>10}")
    print(f"{'TTFT mean (client)':22} {before['ttft_mean_s'] * 1e3:>12.1f}ms {after['ttft_mean_s'] * 1e3:>12.1f}ms "
          f"{-est_ttft_gain * 1e3:>8.1f}ms {-result['measured']['ttft_gain_s'] * 1e3:>8.1f}ms")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
