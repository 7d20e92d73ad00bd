"""What `goodput demo` sends: the calibration probes, the service model they give, and the three
phases cut from a real trace.

Calibration measures, through the sidecar, the two things a replica's SLO capacity rests on:
prefill speed (TTFT of a short and a long prompt, one at a time, one output token each, the
median of three) and the decode step against the batch (TPOT of one stream alone, then of 8
and of 32 at once, each with prompts of the mix's mean length: the step's line and its concave
part, forecaster.service_prior.step_curve); then open-loop Poisson arrivals with the trace's own
mix, 8 s at 0.3 of the capacity those probes give and 20 s at 0.85 of the capacity a fit to that
gives, whose requests' TPOTs (each against the batch it decoded in) and mean TTFT refit the
step's slope and concave part (or the slope alone, where that serves less) and the fixed overhead (what a live mix costs a step, which
short probes miss); the step only where those batches average 8 or more, since a curve through
smaller ones reads the steep start of a concave step as its rise. The second point runs long
and near the knee so that its requests decode in batches of up to 30 (11-22 on average on the
AMD EPYC host), near those where the capacity is decided (docs/service_model/calibration-spread.md). A ramp measured by the sidecar (8 s steps from the model's capacity, x1.5 a step)
was tried and dropped: 8 s at a rate is too short for a queue to build, so every step "met" the
objective up to 4 req/s and the phases cut to that overloaded the replica from phase 1. The result is a `goodput bench engine`-shaped result, so the forecaster takes them as its `--prior` and
the service model of `forecaster.service_model` turns them into requests/s within the SLO for
the trace's own token mix. Nothing is assumed about the machine.

The phases are consecutive slices of the trace, each time-scaled so its mean rate is the
phase's multiple of that capacity: the arrivals keep the trace's own burstiness. Every phase
sends its requests with its own SLO class (same objectives), so the sidecar's counters split
by phase exactly and the report's figures can be checked against them.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from sidecar.loadgen.workload import PlannedRequest
from sidecar.loadgen.workload import arrivals as schedule

CALIBRATION_CLASS = "calibrate"
SHORT_PROMPT = 16            # tokens: TTFT of this is (almost) the fixed overhead
DECODE_TOKENS = 24           # output tokens of a decode probe
DECODE_BATCHES = (8, 32)     # the decode probes beside the one-sequence one: three points give the
                             # step's concave part (forecaster.service_prior.step_curve)


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    load: float              # mean offered rate as a multiple of the calibrated capacity
    seconds: float
    what: str                # one line for the live view and the report


# The burst doubles the load, the step a replica meets when its traffic doubles. A burst at L times
# the capacity C for T seconds leaves a backlog of about (L - 1)·C·T requests, which the recovery
# phase drains with the capacity it leaves spare, (1 - 0.4)·C: 2x for 20 s drains in about 33 s of
# the 80. At 5x for 12 s (the demo until 2026-12-06) it took 80 s at best, longer than the phase,
# and the recovery phase measured the backlog (0 % met on the Xeon host in four runs).
DEFAULT_PHASES = (
    PhaseSpec("under", 0.5, 40.0, "under capacity: goodput should equal throughput"),
    PhaseSpec("burst", 2.0, 20.0, "twice the capacity: the forecaster should ask for replicas first"),
    PhaseSpec("recovery", 0.4, 80.0, "back under capacity: the backlog drains, the forecaster scales back"),
)


@dataclass(frozen=True)
class Phase:
    name: str
    start: float             # seconds from the start of the replay
    end: float
    rate: float              # planned mean arrival rate, req/s
    load: float
    what: str

    @property
    def slo_class(self) -> str:
        return f"phase-{self.name}"


def parse_phases(text: str) -> tuple[PhaseSpec, ...]:
    """`name:load:seconds,...` (e.g. under:0.5:40,burst:2:30,recovery:0.4:50)."""
    out = []
    known = {p.name: p.what for p in DEFAULT_PHASES}
    for part in text.split(","):
        bits = part.strip().split(":")
        if len(bits) != 3:
            raise ValueError(f"phase {part!r}: expected name:load:seconds")
        name, load, seconds = bits[0].strip(), float(bits[1]), float(bits[2])
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"phase {part!r}: the name must be letters, digits, - or _")
        if not (load > 0 and seconds > 0):
            raise ValueError(f"phase {part!r}: load and seconds must be > 0")
        out.append(PhaseSpec(name, load, seconds, known.get(name, f"{load:g}x capacity")))
    if len({p.name for p in out}) != len(out):
        raise ValueError("phase names must differ")
    return tuple(out)


def plan_phases(trace: list[PlannedRequest], capacity: float, specs: tuple[PhaseSpec, ...],
                max_rate: float | None = None) -> tuple[list[PlannedRequest], list[Phase]]:
    """Consecutive slices of `trace`, one per phase, each squeezed or stretched onto its phase's
    seconds so that count / seconds = load x capacity. Wraps around the trace if it runs out."""
    if capacity <= 0:
        raise ValueError(f"capacity must be > 0, got {capacity}")
    if len(trace) < 2:
        raise ValueError("the trace needs at least two requests")
    planned: list[PlannedRequest] = []
    phases: list[Phase] = []
    t, i = 0.0, 0
    # A client that cannot offer the busiest phase's rate scales every phase alike, so the
    # phases keep their ratios (and `load` then says what was offered, as a multiple of capacity).
    scale = 1.0
    if max_rate is not None:
        scale = min(1.0, max_rate / (max(s.load for s in specs) * capacity))
    for spec in specs:
        rate = spec.load * capacity * scale
        count = max(1, round(rate * spec.seconds))
        # One request past the slice marks where its time span ends, so the gaps keep their shape
        # (a wrap-around seam, where the next arrival is earlier, counts as no gap).
        idx = [(i + k) % len(trace) for k in range(count + 1)]
        gaps = [max(0.0, trace[b].arrival - trace[a].arrival) for a, b in zip(idx, idx[1:])]
        span = sum(gaps)
        if span <= 0:
            gaps, span = [1.0] * count, float(count)
        arrivals = [0.0]
        for g in gaps[:-1]:
            arrivals.append(arrivals[-1] + g)
        phase = Phase(spec.name, t, t + spec.seconds, count / spec.seconds, spec.load * scale, spec.what)
        for k, a in enumerate(arrivals):
            src = trace[idx[k]]
            # Requests tied at the slice's end (equal timestamps) stay inside the phase.
            at = t + min(a / span, 1.0 - 1e-9) * spec.seconds
            planned.append(replace(src, arrival=at, slo_class=phase.slo_class))
        phases.append(phase)
        t += spec.seconds
        i = (i + count) % len(trace)
    return planned, phases


def phase_of(phases: list[Phase], scheduled: float) -> Phase:
    """The phase a request belongs to: the one its planned arrival falls in."""
    for p in phases:
        if p.start <= scheduled < p.end:
            return p
    raise ValueError(f"arrival {scheduled:.3f} s is outside every phase")


# -- calibration -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Calibration:
    bench: dict              # `goodput bench engine --json` shape: engine_decode, engine_prefill
    overhead_s: float        # TTFT of the short prompt less its prefill
    capacity: float          # requests/s one replica serves within the SLO, for the trace's mix
    seconds: float           # how long the probes took
    line: str                # what was measured, in one line
    records: tuple = ()      # (stage, records) of every probe and operating point, in order


_PROBES = itertools.count(1)


async def _probe(cfg, prompts, requests: list[PlannedRequest], stage: str = "", log: list | None = None):
    """One probe; `prompts(k)` makes the k-th probe's PromptFactory, so no probe's prompt is in the
    engine's prefix cache from an earlier one. Its records go into `log` as (stage, records)."""
    from sidecar.loadgen.runner import run_load

    records, _ = await run_load(cfg, requests, prompts(next(_PROBES)))
    if log is not None:
        log.append((stage, records))
    bad = [r for r in records if r.outcome not in ("good", "slo_violated")]
    if bad:
        raise RuntimeError(f"calibration request failed: {bad[0].error or bad[0].outcome}")
    return records


async def measure(cfg, prompts, long_prompt: int, decode_prompt: int = SHORT_PROMPT,
                  log: list | None = None) -> tuple[dict, float]:
    """Prefill and decode probes against the endpoint in `cfg`, the decode probes' prompts
    `decode_prompt` tokens long; (bench-shaped dict, TTFT of the short prompt alone). Every probe's
    records go into `log` as (stage, records)."""
    one = lambda n_in, n_out: PlannedRequest(0.0, n_in, n_out, slo_class=CALIBRATION_CLASS)  # noqa: E731
    mine: list = []
    await _probe(cfg, prompts, [one(SHORT_PROMPT, 4)], "warm-up", mine)
    for _ in range(3):                                                      # median of three, one at a time
        await _probe(cfg, prompts, [one(SHORT_PROMPT, 1)], "prefill-short", mine)
        await _probe(cfg, prompts, [one(long_prompt, 1)], "prefill-long", mine)
    await _probe(cfg, prompts, [one(decode_prompt, DECODE_TOKENS)], "decode-1", mine)
    for size in DECODE_BATCHES:
        await _probe(cfg, prompts, [one(decode_prompt, DECODE_TOKENS) for _ in range(size)], f"decode-{size}", mine)
    if log is not None:
        log.extend(mine)
    return bench_from_probes(mine, cfg.model)


def bench_from_probes(log: list, model_name: str) -> tuple[dict, float]:
    """(bench-shaped dict, TTFT of the short prompt alone) from the probes' (stage, records), as
    `measure` takes them: the prefill rate between the short and the long prompt's median TTFTs,
    and the decode step at each batch as the median TPOT of its streams (never under one
    stream's). `calibration-records.jsonl` holds the same stages, so a calibration can be refitted
    from it (scripts/calibration_spread.py)."""
    stages: dict = {}
    for stage, records in log:
        stages.setdefault(stage, []).append(records)
    short = [records[0].ttft for records in stages["prefill-short"]]
    long = [records[0].ttft for records in stages["prefill-long"]]
    long_prompt = stages["prefill-long"][0][0].input_tokens
    t_short, t_long = statistics.median(short), statistics.median(long)
    prefill = (long_prompt - SHORT_PROMPT) / max(t_long - t_short, 1e-6)
    step1 = stages["decode-1"][0][0].tpot
    decode = [{"batch": 1, "step_s": step1}]
    for size in DECODE_BATCHES:
        decode.append({"batch": size, "step_s": max(statistics.median(r.tpot for r in stages[f"decode-{size}"][0]), step1)})
    bench = {"model": model_name, "source": "goodput demo calibration (HTTP probes through the sidecar)",
             "engine_decode": decode,
             "engine_prefill": {"tokens_per_s": prefill, "prompt_tokens": long_prompt},
             # The forecaster's online fit weighs this prior as the requests it was measured on.
             "prior_weight_requests": len(short) + len(long) + 1 + sum(DECODE_BATCHES)}
    return bench, t_short


def write_calibration_records(path, stages) -> None:
    """`calibration-records.jsonl`: one line a request, its stage first, probes in the order sent."""
    import json

    with open(path, "w") as fh:
        for stage, records in stages:
            for r in records:
                fh.write(json.dumps({"stage": stage, **r.to_json()}) + "\n")


def read_calibration_records(path) -> list[tuple[str, list]]:
    """(stage, records) from `write_calibration_records`' file (or its .gz): consecutive lines of a
    stage are one probe (no two probes in a row share a stage: the prefill probes alternate)."""
    import gzip
    import json
    from pathlib import Path

    from sidecar.loadgen.summary import RequestRecord

    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    out: list = []
    for line in text.splitlines():
        row = json.loads(line)
        stage = row.pop("stage")
        if not (out and out[-1][0] == stage):
            out.append((stage, []))
        out[-1][1].append(RequestRecord(**row))
    return out


def probe_model(bench: dict, t_short: float, step_token_budget: int, max_batch: int):
    """The service model the probes give, with the fixed TTFT overhead: what the short prompt's
    TTFT holds beyond what the model itself predicts for it on an idle replica (its prefill and
    the steps around it), so it is not counted twice."""
    import numpy as np

    from forecaster.service_model import TokenMix
    from forecaster.service_prior import model_from_bench

    model = model_from_bench(bench, step_token_budget=step_token_budget, max_batch=max_batch)
    idle = float(model.predict(1e-9, TokenMix(np.array([float(SHORT_PROMPT)]), np.array([1.0]))).ttft_s[0])
    return replace(model, ttft_overhead_s=max(0.0, t_short - idle))


OPERATING_LOADS = (0.3, 0.85)       # the open-loop points: of the probes' capacity, then of the first fit's
OPERATING_SECONDS = (8.0, 20.0)


async def measure_operating_point(cfg, prompts, mix_prompt, mix_output, rate: float, seconds: float, seed: int = 5,
                                  log: list | None = None, stage: str = "operating"):
    """Poisson arrivals at `rate` for `seconds`, sizes drawn from the trace's mix: the records."""
    import numpy as np

    n = max(4, round(rate * seconds))
    # At exactly `rate`, which the fit below predicts at: drawn as they come, the first point's
    # 11-12 requests offered 1.3-1.4x it (requests over the last arrival).
    arrivals = schedule(rate, n, seed) - 1.0 / rate
    pick = np.random.default_rng(seed).integers(0, len(mix_prompt), n)
    reqs = [PlannedRequest(float(a), int(mix_prompt[i]), int(mix_output[i]), slo_class=CALIBRATION_CLASS)
            for a, i in zip(arrivals, pick)]
    return await _probe(cfg, prompts, reqs, stage, log)


def decode_loads(records, prefill_tokens_per_s: float) -> tuple[list[float], list[float], list[float]]:
    """What each request of an open-loop run decoded beside, read from the run's own timings:
    (TPOT, the batch it decoded in, the other prompts' prefill seconds per token gap that fell in
    its decode), for every request with two or more output tokens.

    The batch is itself plus the time-average count of the others decoding during its decode
    (first token to end); another's prompt is taken to prefill just before its first token, at
    `prefill_tokens_per_s`. Arrivals in a short run clump (Poisson), so the batch they leave
    differs from run to run at one rate: measured on SmolLM2 at 4 req/s, two 12-s runs and a 50-s
    one had mean TPOTs of 194, 127 and 153 ms, and their requests decoded in batches of 21.3, 14.7
    and 17.9 on average."""
    done = [r for r in records if r.ttft is not None and r.e2e is not None]
    decode = [(r.scheduled + r.ttft, r.scheduled + r.e2e) for r in done]
    prefill = [(first - r.input_tokens / prefill_tokens_per_s, first) for r, (first, _) in zip(done, decode)]
    tpots, batches, interference = [], [], []
    for i, r in enumerate(done):
        a, b = decode[i]
        if r.tpot is None or r.output_tokens < 2 or b <= a:
            continue
        beside = _overlap(a, b, decode, i) / (b - a)
        prefilled = _overlap(a, b, prefill, i)
        tpots.append(r.tpot)
        batches.append(1.0 + beside)
        interference.append(prefilled / (r.output_tokens - 1))
    return tpots, batches, interference


def _overlap(a: float, b: float, spans: list[tuple[float, float]], skip: int) -> float:
    """Seconds of [a, b] that the spans cover, summed over the spans but the one at `skip`."""
    return sum(max(0.0, min(b, y) - max(a, x)) for j, (x, y) in enumerate(spans) if j != skip)


def fit_to_operating_point(model, mix, rate: float, records, min_batch: float = 0.0, slo=None):
    """The decode step's rise with the batch that the run's requests show, each against the batch
    it actually decoded in (`decode_loads`): TPOT = step(batch) + the prefill that ran during its
    decode per gap, with step(b) = s1 + c·(b − 1) + d·ln b, s1 the model's step at one sequence
    (the one-stream probe) held, and the slope c and the concave part d both fitted (least
    squares, both >= 0). Then the fixed TTFT overhead that closes the mean TTFT gap at `rate`.
    The probes alone miss what a live mix costs a step (longer contexts, prompts prefilled beside
    it, the other processes on the machine); one measured operating point pins it.

    Both terms, not the slope alone under the probes' concave part: the probes' 8-stream step
    varies by about 10 % from run to run, which moved the concave part from 14 to 31 ms·ln b,
    and a slope fitted under it at batches of 10-20 extrapolated that to the batches of 30-50
    where the capacity is decided (SmolLM2 on a 2-core AMD EPYC: eight calibrations read
    2.75-4.43 req/s; with both terms fitted to the same requests, 2.77-3.63;
    docs/service_model/calibration-spread.md). Both fits need the requests' batches to span a
    range: through batches of 4-13 the concave part alone took the rise and the capacity read
    5.63 where the engine serves about 3. So where `slo` (Slo list) is given, the slope alone is
    refitted as well (under the probes' concave part) and the fit that serves less is returned.

    With too few requests to fit (fewer than 3 that decoded, or none beside another where the
    model's step has a one-sequence figure of its own), the model is returned as it is. Where the
    requests decoded in batches of fewer than `min_batch` on average, the probes' curve is kept
    (only the overhead is fitted): a line through small batches extrapolates the steep start of a
    concave step. SmolLM2 in float32 on a 2-core AMD EPYC steps 43, 75 and 106 ms at 1, 2 and 4
    sequences and 172 ms at 32; fitted at 0.8-1.3 req/s (batches of 2-3) the slope read 17-22 ms a
    sequence, and the capacity 1.0-1.2 req/s where the engine met the objective at 4.5."""
    fits = operating_point_fits(model, mix, rate, records, min_batch)
    if slo is None or len(fits) == 1:
        return fits.get("both") or next(iter(fits.values()))
    # Where the two shapes part beyond the batches measured, the data cannot tell them apart, and
    # the one that serves less is planned on.
    return min(fits.values(), key=lambda m: m.slo_capacity_rps(mix, slo))


def operating_point_fits(model, mix, rate: float, records, min_batch: float = 0.0) -> dict:
    """The fits `fit_to_operating_point` chooses from: {"both": the slope and the concave part
    refitted, "slope": the slope alone under the model's concave part}, each with the fixed
    overhead fitted; {"probes": `model` with the overhead only} where the batches average under
    `min_batch`; {"as is": `model`} where too few requests decoded to fit anything."""
    import numpy as np

    tpots, batches, interference = decode_loads(records, model.prefill_tokens_per_s)
    ttfts = [r.ttft for r in records if r.ttft is not None]
    if len(tpots) < 3 or not ttfts:
        return {"as is": model}
    if float(np.mean(batches)) < min_batch:
        return {"probes": with_overhead(model, mix, rate, ttfts)}
    fits = {}
    for name, concave in (("both", True), ("slope", False)):
        fitted = refit_step(model, tpots, batches, interference, concave=concave)
        if fitted is not None:
            fits[name] = with_overhead(fitted, mix, rate, ttfts)
    return fits or {"as is": model}


def refit_step(model, tpots, batches, interference, concave: bool = True):
    """`model` with its decode step's rise refitted to requests' TPOTs less the prefill that ran
    beside them, each at the batch it decoded in (`decode_loads`): the slope and the concave part
    both (>= 0), the step at one sequence held, or (`concave=False`) the slope alone under the
    model's concave part, its base held. None where the batches carry nothing to fit."""
    import numpy as np

    y = np.array(tpots) - np.array(interference)
    if not concave:
        flat, lin = replace(model, decode_per_seq_s=0.0), replace(model, decode_per_seq_s=1.0)
        g0 = np.array([flat.step_s(b) for b in batches])
        g1 = np.array([lin.step_s(b) for b in batches]) - g0
        if not np.sum(g1 * g1) > 0:
            return None
        return replace(model, decode_per_seq_s=max(0.0, float(np.sum(g1 * (y - g0)) / np.sum(g1 * g1))))
    # step(b) is linear in (c, d) for any shape of the model's step (its context term, a
    # one-sequence figure of its own): f0 + c·fc + d·fd, read off the model at unit changes.
    s1 = model.decode_base_s + model.decode_per_seq_s      # the curve at one sequence (ln 1 = 0)
    unit = s1 / 2.0                                       # keeps every base positive

    def curve(c: float, d: float):
        return replace(model, decode_base_s=s1 - c, decode_per_seq_s=c, decode_log_s=d)

    f0 = np.array([curve(0.0, 0.0).step_s(b) for b in batches])
    fc = (np.array([curve(unit, 0.0).step_s(b) for b in batches]) - f0) / unit
    fd = (np.array([curve(0.0, unit).step_s(b) for b in batches]) - f0) / unit
    if not (np.any(fc) or np.any(fd)):
        return None
    from scipy.optimize import lsq_linear

    # 0 <= c < s1 keeps the base positive; d >= 0.
    c, d = lsq_linear(np.column_stack([fc, fd]), y - f0, bounds=([0.0, 0.0], [s1 - 1e-4, np.inf])).x
    return curve(float(c), float(d))


def with_overhead(model, mix, rate: float, ttfts: list[float]):
    """`model` with the fixed TTFT overhead that closes the mean TTFT gap at `rate` (never less
    than the one it has)."""
    import numpy as np

    fitted = replace(model, ttft_overhead_s=0.0)
    pred = fitted.predict(rate, mix)
    ttft_pred = float(np.mean(pred.ttft_s)) if pred.stable else math.inf
    overhead = max(0.0, float(np.mean(ttfts)) - ttft_pred) if math.isfinite(ttft_pred) else model.ttft_overhead_s
    return replace(fitted, ttft_overhead_s=max(overhead, model.ttft_overhead_s))


def calibrate(cfg, prompts: Callable[[int], object], mix_prompt: list[int], mix_output: list[int], ttft: float, tpot: float,
              objective: float, step_token_budget: int, max_batch: int, time_scale: float = 1.0,
              max_rate: float | None = None) -> Calibration:
    """`time_scale` shortens every open-loop stage alike (the tiny model's quick demo); rates
    never exceed `max_rate` (a client that cannot offer more)."""
    import time

    import numpy as np

    from forecaster.service_model import Slo, TokenMix

    t0 = time.monotonic()
    # The longest prompt of the mix (at least 256 tokens): the prefill rate is a slope, and a
    # short one would drown it in the fixed overhead's noise.
    long_prompt = max(256, int(max(mix_prompt)))
    log: list = []
    bench, t_short = asyncio.run(measure(cfg, prompts, long_prompt, max(SHORT_PROMPT, round(float(np.mean(mix_prompt)))),
                                         log=log))
    model = probe_model(bench, t_short, step_token_budget, max_batch)
    mix = TokenMix.from_samples(mix_prompt, mix_output)
    slo = [Slo(ttft, tpot, objective, "demo")]
    probe_capacity = model.slo_capacity_rps(mix, slo)
    if not probe_capacity > 0:
        raise RuntimeError(f"the measured service model serves nothing within TTFT {ttft} s / TPOT {tpot} s: "
                           f"decode step {bench['engine_decode'][0]['step_s'] * 1000:.0f} ms at batch 1, "
                           f"prefill {bench['engine_prefill']['tokens_per_s']:.0f} tokens/s; loosen the SLO")
    # Open loop with the trace's own mix, twice: first at a share of the probes' capacity that is
    # safe even where short probes overstate it several-fold, then for 20 s at 0.85 of the
    # capacity that first fit gives, so that its requests decode in batches near those where the
    # capacity is decided (12 s at 0.7 left them at 8-15 on the AMD EPYC host, and the capacity
    # then followed the probes' concave part: docs/service_model/calibration-spread.md). Past the
    # knee, where a first fit overstates the capacity, the batches only grow, and each fit reads
    # the step from the batches the run's requests decoded in, not from its rate.
    tpots: list = []
    ttfts: list = []
    records: list = []
    rates: list = []
    first, capacity = model, probe_capacity
    for k, (load, seconds) in enumerate(zip(OPERATING_LOADS, OPERATING_SECONDS)):
        rate = load * capacity   # of the probes' capacity, then of the first fit's
        if max_rate is not None:
            rate = min(rate, max_rate)
        records = asyncio.run(measure_operating_point(cfg, prompts, mix_prompt, mix_output, rate, seconds * time_scale,
                                                      seed=5 + k, log=log, stage=f"operating-{k + 1}"))
        rates.append(rate)
        tpots = [r.tpot for r in records if r.tpot is not None and r.output_tokens > 1]
        ttfts = [r.ttft for r in records if r.ttft is not None]
        model = fit_to_operating_point(first, mix, rate, records, min_batch=DECODE_BATCHES[0], slo=slo)
        capacity = model.slo_capacity_rps(mix, slo)
        if not capacity > 0:
            break
    if not capacity > 0:
        raise RuntimeError(f"at {rate:.2f} req/s this engine's mean TPOT was {np.mean(tpots) * 1000:.0f} ms and TTFT "
                           f"{np.mean(ttfts) * 1000:.0f} ms: the service model fitted to that serves nothing within "
                           f"TTFT {ttft} s / TPOT {tpot} s; loosen the SLO")
    # The forecaster's prior: the fitted step at the probes' batches, beside the raw probes.
    bench["probes"] = {"engine_decode": bench["engine_decode"], "operating_point": {
        "rate": rate, "rates": rates, "requests": len(records), "tpot_mean_s": float(np.mean(tpots)) if tpots else None,
        "ttft_mean_s": float(np.mean(ttfts)) if ttfts else None}}
    bench["engine_decode"] = [{"batch": b, "step_s": model.step_s(b)} for b in (1, *DECODE_BATCHES)]
    bench["ttft_overhead_s"] = model.ttft_overhead_s
    bench["prior_weight_requests"] += len(records)
    seconds = time.monotonic() - t0
    line = (f"measured in {seconds:.0f} s: prefill {model.prefill_tokens_per_s:.0f} tokens/s; decode step "
            f"{model.decode_base_s * 1000:.0f} ms + {model.decode_per_seq_s * 1000:.1f} ms per sequence + "
            f"{model.decode_log_s * 1000:.1f} ms·ln(sequences), the slope "
            f"fitted to the TPOTs of {len(tpots)} requests at {rate:.2f} req/s open loop, each against the batch "
            f"it decoded in (mean TPOT {np.mean(tpots) * 1000:.0f} ms); TTFT overhead {model.ttft_overhead_s * 1000:.0f} ms -> the service "
            f"model serves {capacity:.2f} req/s of this trace's mix (mean {np.mean(mix_prompt):.0f} prompt + "
            f"{np.mean(mix_output):.0f} output tokens) within TTFT {ttft:g} s / TPOT {tpot:g} s for "
            f"{objective:.0%} of requests")
    return Calibration(bench, model.ttft_overhead_s, capacity, seconds, line, tuple(log))
