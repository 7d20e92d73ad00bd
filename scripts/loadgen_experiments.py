"""The load-generator measurements in the README, reproducible: `python scripts/loadgen_experiments.py`.

1. Chunked prefill on vs off under a mix of long and short prompts: p99 TPOT and goodput.
2. Prefix caching on vs off replaying the Mooncake trace: TTFT and goodput.
3. The goodput curve with its knee beside the throughput curve (`goodput sweep`).

The on/off comparisons run side by side: two engines at once, each pinned to one of the two
cores (taskset; the engine then uses one thread), each driven by its own `goodput load` with the
same workload and seed at the same moment. Whatever else the machine is doing hits both alike;
run one after the other, the comparison would measure the machine's mood. Results go to
docs/loadgen/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from goodput_cli.procs import ServerProcess, goodput_command

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "loadgen"
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"


def engine(model: str, port: int, *flags: str, core: int | None = None) -> ServerProcess:
    pin = ["taskset", "-c", str(core)] if core is not None else []
    return ServerProcess(pin + goodput_command("engine", "serve", "--model", model, "--port", str(port), *flags),
                         f"http://127.0.0.1:{port}/health", timeout=600, name="engine")


def side_by_side(model: str, port: int, configs: dict[str, list[str]], tag: str, load_args: list[str]) -> dict:
    """Both engine configurations at once, one per core, each under the same load at the same time."""
    (a, flags_a), (b, flags_b) = configs.items()
    with engine(model, port, *flags_a, core=0), engine(model, port + 1, *flags_b, core=1):
        procs, outs = [], []
        for i, name in enumerate((a, b)):
            out = OUT / f"{tag}-{name.split()[-1]}.json"
            cmd = goodput_command("load", "--url", f"http://127.0.0.1:{port + i}", "--json", str(out), "--quiet", *load_args)
            print(f"$ goodput {' '.join(cmd[3:])}    # {name}", flush=True)
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            outs.append(out)
        for name, proc in zip((a, b), procs):
            text, _ = proc.communicate()
            print(f"--- {name}\n{text}", flush=True)
            if proc.returncode != 0:
                raise SystemExit(f"load failed for {name}")
    return {name: json.loads(out.read_text()) for name, out in zip((a, b), outs)}


def tokenizer(model: str) -> list[str]:
    from goodput_cli.demo import tokenizer_file

    path = tokenizer_file(model)
    return ["--tokenizer", str(path)] if path else []


def chunked(model: str, port: int, rate: float, n: int) -> dict:
    args = ["--rate", str(rate), "--num-requests", str(n), "--input-tokens", "64", "--output-tokens", "32",
            "--long-fraction", "0.25", "--long-input-tokens", "1024", "--slo-ttft", "5", "--slo-tpot", "0.25",
            "--seed", "7", *tokenizer(model)]
    return side_by_side(model, port, {"chunked prefill on": ["--max-num-batched-tokens", "128"],
                                      "chunked prefill off": ["--no-chunked-prefill"]}, "chunked", args)


def prefix(model: str, port: int, count: int, speedup: float) -> dict:
    args = ["--trace", str(MOONCAKE), "--trace-ties", "as-logged", "--limit", str(count), "--speedup", str(speedup), "--length-scale", "0.03125",
            "--max-input", "128", "--max-output", "4", "--slo-ttft", "3", "--slo-tpot", "0.5", *tokenizer(model)]
    return side_by_side(model, port, {"prefix caching on": [], "prefix caching off": ["--no-prefix-caching"]},
                        "prefix", args)


def sweep(model: str, port: int, rates: str, duration: float) -> None:
    with engine(model, port):
        cmd = goodput_command("sweep", "--url", f"http://127.0.0.1:{port}", "--rates", rates, "--duration", str(duration),
                              "--input-tokens", "128", "--output-tokens", "32", "--slo-ttft", "3", "--slo-tpot", "0.3",
                              "--out", str(OUT / "sweep"), "--quiet", *tokenizer(model))
        print("$", " ".join(["goodput", *cmd[3:]]), flush=True)
        subprocess.run(cmd, check=True)


def table(results: dict) -> str:
    def ms(d, k):
        return "-" if d.get(k) is None else f"{d[k] * 1000:.0f}"

    rows = ["| configuration | goodput req/s | attainment | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | output tok/s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in results.items():
        rows.append(f"| {name} | {s['goodput']:.3f} | {s['attainment'] * 100:.1f} % | {ms(s['ttft'], 'p50')} | "
                    f"{ms(s['ttft'], 'p99')} | {ms(s['tpot'], 'p50')} | {ms(s['tpot'], 'p99')} | {s['output_tokens_per_s']:.1f} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--port", type=int, default=18100)
    p.add_argument("--only", choices=("chunked", "prefix", "sweep"), action="append")
    p.add_argument("--chunked-rate", type=float, default=0.3)
    p.add_argument("--chunked-requests", type=int, default=40)
    # Mooncake's reuse is between turns of a conversation, minutes apart: the first 400 requests
    # (141 s) reuse 24 % of their first eight 16-token blocks, the first 30 only 8 %. Prompts are
    # capped at 128 tokens and outputs at 4 so that 400 requests fit in five minutes on one core.
    p.add_argument("--prefix-requests", type=int, default=400)
    p.add_argument("--prefix-speedup", type=float, default=0.45)
    p.add_argument("--sweep-rates", default="0.25,0.5,1,1.5,2,3")
    p.add_argument("--sweep-duration", type=float, default=40)
    a = p.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    only = set(a.only or ("chunked", "prefix", "sweep"))
    md = []
    if "chunked" in only:
        md += ["### Chunked prefill on vs off", "", table(chunked(a.model, a.port, a.chunked_rate, a.chunked_requests)), ""]
    if "prefix" in only:
        md += ["### Prefix caching on vs off (Mooncake replay)", "", table(prefix(a.model, a.port, a.prefix_requests, a.prefix_speedup)), ""]
    if "sweep" in only:
        sweep(a.model, a.port, a.sweep_rates, a.sweep_duration)
        md += ["### Goodput sweep", "", (OUT / "sweep" / "summary.md").read_text()]
    # The machine is shared: say how busy it was, since absolute latencies depend on it.
    md.append(f"Load average at the end (1/5/15 min, 2 cores): {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")
    (OUT / f"results-{'-'.join(sorted(only))}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
