"""`goodput bench sidecar`: what the sidecar adds, measured open loop beside a relay and LiteLLM.

Method (Envoy's Nighthawk, Istio's and wrk2's): open-loop Poisson arrivals at fixed rates below
the knee, so a slow arm cannot slow its own load down (no coordinated omission); the rate is set
by Little's law to give the wanted number of concurrent streams. Every arm is loaded with the
same arrival schedule as the direct path in the same repeat, so added TTFT is taken per request
(arm minus direct, request by request) and reported with bootstrap 95 % intervals. Arms run
interleaved, in a rotated order per repeat, each repeat with its own schedule. CPU per request
and per token comes from the kernel for each process (psutil), with the arm pinned to its own
core where the machine has two or more, and the 1-minute load average is kept with every run.
After a run an arm could not keep up with, the arm is restarted, and every run waits for the
shared upstream to have nothing in flight: a saturated proxy keeps forwarding its backlog long
after its client gave up (LiteLLM's did for minutes, and every run after it timed out connecting).

Scenarios (`SCENARIOS`): paced streams (a token every 20 ms, as a GPU decoding a batch) at 16
and 64 concurrent streams; one-token requests for the CPU cost per request, with a one-word
prompt and with 2,048-token prompts (what grows with the prompt: parsing, relaying and the
prompt-layout advice); the sparse pattern
(256 streams at a token every 100 ms: every token its own read and write, the wake-up pattern
of hundreds of streams on a GPU replica); and the fast upstream (tokens as fast as its loop
allows), closed loop at 64 streams, for the token rate each arm sustains.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from sidecar.bench.arms import ARMS, CorePlan, Stack, pin, start_stack
from sidecar.bench.report import Run, print_table, summarise

_FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "sidecar" / "fixtures" / "vllm_v1_new.txt"


@dataclass(frozen=True)
class Scenario:
    name: str
    ttft: float            # the scripted upstream's first-token delay (s)
    itl: float             # its gap between tokens (s); 0 = as fast as its loop allows
    tokens: int            # tokens per response
    streams: int           # concurrent streams wanted
    closed: bool = False   # closed loop (token rate) instead of open-loop arrivals
    description: str = ""
    prompt_tokens: int = 0  # the request's prompt, in tokens of code-like text (0: one word)
    per_second: float | None = None   # open-loop arrivals a second; None: from `streams`

    @property
    def stream_seconds(self) -> float:
        return self.ttft + (self.tokens - 1) * self.itl

    @property
    def rate(self) -> float:
        """Open-loop arrivals per second: `per_second`, else what keeps `streams` streams open on
        average (Little's law)."""
        if self.per_second is not None:
            return self.per_second
        return self.streams / self.stream_seconds if self.stream_seconds > 0 else 0.0


SCENARIOS = {s.name: s for s in (
    Scenario("paced16", 0.02, 0.02, 32, 16, description="16 paced streams, open loop: 32 tokens at 20 ms"),
    Scenario("paced64", 0.02, 0.02, 32, 64, description="64 paced streams, open loop: 32 tokens at 20 ms"),
    Scenario("requests", 0.02, 0.02, 1, 1, per_second=50.0,
             description="one-token requests, open loop at 50/s: CPU per request"),
    Scenario("requests2k", 0.02, 0.02, 1, 1, per_second=50.0, prompt_tokens=2048,
             description="the same with 2,048-token prompts (the Azure code trace's mean): CPU per request"),
    Scenario("sparse", 0.02, 0.1, 64, 256, description="sparse: 256 streams, a token every 100 ms, each its own read"),
    Scenario("fast64", 0.0, 0.0, 64, 64, closed=True, description="fast upstream, 64 streams closed loop: token rate"),
)}

# Sent to every arm alike (LiteLLM's proxy refuses to start without a strong master key).
_API_KEY = "sk-goodput-bench-" + secrets.token_hex(16)


def _client_argv(url: str, sc: Scenario, duration: float, seed: int) -> list[str]:
    argv = [sys.executable, "-m", "sidecar.bench.client", "--url", url, "--tokens", str(sc.tokens),
            "--duration", str(duration), "--api-key", _API_KEY, "--prompt-tokens", str(sc.prompt_tokens)]
    if sc.closed:
        return argv + ["--concurrency", str(sc.streams)]
    return argv + ["--rate", f"{sc.rate:.6g}", "--seed", str(seed), "--grace", str(max(10.0, 3 * sc.stream_seconds))]


def _measure(stack: Stack, sc: Scenario, arm: str, repeat: int, duration: float, plan: CorePlan) -> Run:
    middle = stack.procs.get(arm)
    before = (stack.upstream.cpu(), middle.cpu() if middle else 0.0, resource.getrusage(resource.RUSAGE_CHILDREN))
    proc = subprocess.Popen(_client_argv(stack.urls[arm], sc, duration, seed=1000 * repeat + 17),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pin(proc.pid, plan.load)
    out, err = proc.communicate()
    after = (stack.upstream.cpu(), middle.cpu() if middle else 0.0, resource.getrusage(resource.RUSAGE_CHILDREN))
    if proc.returncode != 0:
        raise RuntimeError(f"load client failed: {err.decode(errors='replace')[-2000:]}")
    doc = json.loads(out)
    client_cpu = (after[2].ru_utime - before[2].ru_utime) + (after[2].ru_stime - before[2].ru_stime)
    return Run(scenario=sc.name, arm=arm, repeat=repeat, records=doc["requests"],
               scheduled=doc.get("scheduled", len(doc["requests"]) + doc["errors"]), errors=doc["errors"],
               unfinished=doc["unfinished"], tokens=doc["tokens"], elapsed=doc["elapsed"],
               cpu_arm=after[1] - before[1], cpu_upstream=after[0] - before[0], cpu_client=client_cpu,
               loadavg_1m=os.getloadavg()[0], worst_send_lag=doc["worst_send_lag_s"],
               first_error=doc.get("first_error"))


def run_benchmark(scenarios: tuple[str, ...], arms: tuple[str, ...], duration: float, repeats: int,
                  json_path: Path | None) -> int:
    from rich.progress import Progress

    plan = CorePlan.for_machine()
    pin(os.getpid(), plan.load)      # the orchestrator mostly sleeps, but never on the arm's core
    print(f"goodput bench sidecar: {plan.describe()}; load average now {os.getloadavg()[0]:.2f}", flush=True)
    chosen = [SCENARIOS[n] for n in scenarios]
    runs: list[Run] = []
    missing: dict[str, str] = {}
    exported: dict[str, int] = {}     # what the sidecar-otlp arm's receiver counted, all stacks
    stacks: dict[tuple[float, float], list[Scenario]] = {}
    for sc in chosen:      # scenarios sharing an upstream share its processes
        stacks.setdefault((sc.ttft, sc.itl), []).append(sc)
    with Progress(transient=True) as progress:
        task = progress.add_task("benchmark", total=len(chosen) * len(arms) * repeats)
        for (ttft, itl), group in stacks.items():
            progress.update(task, description=f"starting upstream (ttft {ttft}, itl {itl}) and arms")
            stack = start_stack(ttft, itl, plan, arms, str(_FIXTURE) if _FIXTURE.exists() else None,
                                _API_KEY)
            present = tuple(a for a in arms if a in stack.urls)
            try:
                for arm in present:   # warm-up: imports, pooled connections, first-request costs
                    _measure(stack, group[0], arm, -1, 1.0, plan)
                for sc in group:
                    for repeat in range(repeats):
                        order = present[repeat % len(present):] + present[:repeat % len(present)]
                        for arm in order:
                            if arm in stack.missing:     # did not come back from a restart
                                progress.advance(task)
                                continue
                            progress.update(task, description=f"{sc.name} repeat {repeat + 1}/{repeats}: {arm}")
                            # Long streams need a longer window to spend most of it at full concurrency.
                            run = _measure(stack, sc, arm, repeat, max(duration, 2 * sc.stream_seconds), plan)
                            runs.append(run)
                            try:
                                stack.settle(arm, saturated=bool(run.unfinished or run.errors))
                            except (RuntimeError, TimeoutError) as exc:
                                # One arm (or the upstream) that will not restart ends its own
                                # measurements, not the benchmark: the rest is still printed.
                                why = str(exc).splitlines()[0]   # the process's log follows; it stays on disk
                                stack.missing[arm] = f"stopped after {sc.name} repeat {repeat + 1}: {why}"
                                print(f"goodput bench sidecar: {arm}: {why}; measuring the other arms without it",
                                      file=sys.stderr, flush=True)
                            progress.advance(task)
                    progress.advance(task, (len(arms) - len(present)) * repeats)
            finally:
                stack.stop()
                for key, value in (stack.exported or {}).items():
                    exported[key] = exported.get(key, 0) + value
                missing.update(stack.missing)
    settings = {"duration_s": duration, "repeats": repeats, "arms": list(arms),
                "event_loop": os.environ.get("GOODPUT_EVENT_LOOP", "auto (uvloop when importable)")}
    described = {sc.name: {**asdict(sc), "rate_per_s": None if sc.closed else sc.rate} for sc in chosen}
    doc = summarise(runs, described, settings, missing, plan.describe())
    if "sidecar-otlp" in arms:
        doc["otlp_sink"] = exported
    print_table(doc)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        doc_out = dict(doc, runs=[asdict(r) for r in runs])
        json_path.write_text(json.dumps(doc_out, indent=1, sort_keys=True) + "\n")
        print(f"wrote {json_path}")
    return 0


def parse_arms(text: str) -> tuple[str, ...]:
    arms = tuple(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in arms if a not in ARMS]
    if bad or "direct" not in arms:
        raise ValueError(f"--arms must name some of {', '.join(ARMS)} and include direct, got {text!r}")
    return arms


def parse_scenarios(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [n for n in names if n not in SCENARIOS]
    if bad or not names:
        raise ValueError(f"--scenarios must name some of {', '.join(SCENARIOS)}, got {text!r}")
    return names
