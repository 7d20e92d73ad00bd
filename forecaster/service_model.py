"""What one replica serves within an SLO: the service model shared by the forecaster and the simulator.

A replica is an engine with continuous batching and chunked prefill, scheduled as vLLM V1 does:
every step carries one token for each decoding sequence plus up to `step_token_budget` prompt
tokens. Its parameters:

- decode step time: step(b) = decode_base_s + decode_per_seq_s·b + decode_log_s·ln(b) +
  decode_per_ctx_token_s·(context tokens the batch holds) — weights read once a step, KV reads and
  a little compute per sequence, and on a CPU a concave part (its products grow slower than their
  rows: SmolLM2 on the EPYC stepped 59 / 112 / 164 / 208 ms at 1 / 2 / 6 / 12 sequences; 0 on a
  memory-bound accelerator) — from two sequences on; one sequence decoding alone steps in
  `decode_single_s` (on the curve, a + c, unless set: on a CPU a one-row product runs as a
  matrix-vector kernel, measured at half the two-sequence step), joined linearly to the curve at two;
- prefill throughput `prefill_tokens_per_s` (a chunk of C tokens adds C / rate to its step);
- KV capacity in tokens and the largest batch (vLLM's max_num_seqs).

`predict(rate, mix)` answers, for one replica receiving `rate` requests/s of a token mix: the
decode batch, TTFT and TPOT (means and quantiles) and the share of requests meeting an SLO. It is
a fluid approximation for decode plus an M/G/1 queue for prefill:

- Work conservation: a decoding sequence steps beside the others decoding with it, a Poisson
  count of mean B (the time-average batch, as in an M/G/∞ system), so its mean step is
  seen(B) = a + c'·(1 + B) + d·E[ln(1 + K)] + e^(−B)·(single − step(1)) (K ~ Poisson(B); the share
  e^(−B) of its steps it decodes alone), and Little's law gives B = λŌ·seen(B) / (1 − ρ_p), where
  ρ_p = λP̄ / rate_p is the share of time spent on prompt tokens: on the line, B = λŌ·(a + c') /
  (1 − ρ_p − λŌ·c'), a = decode_base_s and c' the per-sequence cost including its context (else
  solved by a safeguarded Newton's method). Stable only while the denominator is positive,
  B <= max_batch and B·(P̄ + Ō/2) fits the KV cache.
- Prefill is FIFO; a prompt of P tokens occupies the prefill "server" for
  S(P) = P / rate_p + (P / C)·step(B) (its chunks ride on decode steps; counted pro rata, as the
  simulator's fleet does: an engine's whole-step granularity, about half a step of wait and the
  rest of a partial chunk's step, is absorbed into the learned prefill rate). Waiting time is
  M/G/1: the Pollaczek-Khinchine mean, and a tail P(W > x) ∝ e^(−θx) at the Cramér-Lundberg rate
  θ, the positive root of λ(E[e^(θS)] − 1) = θ over the mix's service times (the M/G/1 waiting
  time's exact asymptotic decay: θ = μ − λ for exponential service, about twice as fast for
  near-constant prompts, slower for a heavy-tailed mix); the share that waits at all is what keeps
  the mean. Where arrivals come in clumps (`arrival_dispersion` I > 1, the index of dispersion of
  the requests a replica receives at about a prompt's service time, which the sidecars measure),
  the queue is M^X/G/1: clumps arrive as a Poisson process, each a geometric count of requests
  (mean (I + 1) / 2, which has index I), a clump waits as one job of its members' summed
  prompts, and a request then waits for the members of its clump ahead of it (mean (I − 1) / 2).
  Measured against the simulated replica in scripts/clumped_arrivals.py.
- Quantiles come from a fixed set of sampled requests (common random numbers, so predictions at
  neighbouring loads are monotone): TTFT_i = overhead + W_i + S(P_i) + 1.5·seen(B) (the rest of
  the step running when it arrives, and the step that samples its first token). TPOT_i is the
  step it decodes in plus the prompt work processed during its own decode, spread over its
  O_i − 1 tokens: the prompts that queued behind it (Poisson arrivals over W_i + S_i, so a request
  that waited decodes through the rest of its busy period) and those arriving while it decodes, at
  most a chunk a step. Its step follows the load over its life: the arrivals in its window and
  the sequences decoding when it started (Poisson, mean B), against their mean, are the local load
  r_i, and it decodes in the fluid batch at r_i·λ (at most everyone who overlapped it, and the
  engine's batch limit): a burst grows the batch, which slows the step, lengthens every decode
  and grows the batch again, so TPOT's tail is wider than the arrivals' and widens towards
  saturation. It decodes alone throughout (at `decode_single_s`) with probability e^(−b) at its
  local batch b, and otherwise on the line. (Measured against the simulator's fleet: the TPOT
  p50/p90/p99 errors' median fell from 12 % to 4 % and the largest from 45 % to 21 % against the
  mean batch alone.)

The simulator's fleet (forecaster/simulate/fleet.py) runs the same physics request by request;
tests/forecaster/test_service_model.py measures how far the closed form is from it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from forecaster.prompt_queue import clumped_waits, queue_waits

_SAMPLES = 4000
# The sidecar's per-request token histogram buckets (goodput_request_input_tokens): 1 to 128k.
TOKEN_BUCKETS = tuple(float(2 ** k) for k in range(18)) + (math.inf,)


@dataclass(frozen=True)
class Slo:
    """An SLO class's objectives: TTFT and TPOT both met, for `ratio` of its requests."""

    ttft_s: float
    tpot_s: float
    ratio: float = 0.99
    name: str = "default"

    def __post_init__(self) -> None:
        if self.ttft_s <= 0 or self.tpot_s <= 0:
            raise ValueError(f"SLO objectives must be positive, got ttft_s={self.ttft_s}, tpot_s={self.tpot_s}")
        if not 0 < self.ratio < 1:
            raise ValueError(f"SLO objective ratio must be in (0, 1), got {self.ratio}")


@dataclass(frozen=True)
class TokenMix:
    """The distribution of request sizes: sampled prompt and output lengths (tokens)."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __post_init__(self) -> None:
        if len(self.prompt_tokens) == 0 or len(self.prompt_tokens) != len(self.output_tokens):
            raise ValueError("a token mix needs as many prompt as output lengths, and at least one")

    @classmethod
    def from_samples(cls, prompt, output, n: int = _SAMPLES, seed: int = 7) -> "TokenMix":
        """A fixed-size resample of observed (prompt, output) pairs, kept paired."""
        prompt = np.asarray(prompt, dtype=float)
        output = np.maximum(1.0, np.asarray(output, dtype=float))
        rng = np.random.default_rng(seed)
        pick = rng.integers(0, len(prompt), n) if len(prompt) != n else np.arange(n)
        return cls(prompt[pick], output[pick])

    @classmethod
    def from_means(cls, prompt_mean: float, output_mean: float, n: int = _SAMPLES, seed: int = 7) -> "TokenMix":
        """What the fleet's counters tell: only the mean lengths. Shapes are assumed exponential
        (coefficient of variation 1, about what the Azure and Mooncake traces show for prompts),
        which prices the queueing that variable lengths cause instead of assuming none."""
        if not (prompt_mean > 0 and output_mean > 0):
            raise ValueError(f"mean lengths must be > 0, got prompt {prompt_mean}, output {output_mean}")
        u = (np.arange(n) + 0.5) / n
        rng = np.random.default_rng(seed)
        prompt = np.maximum(1.0, np.round(-prompt_mean * np.log1p(-u)))
        output = np.maximum(1.0, np.round(-output_mean * np.log1p(-rng.permutation(u))))
        return cls(prompt, output)

    @classmethod
    def from_histograms(cls, prompt_hist: dict, output_hist: dict, prompt_mean: float | None = None,
                        output_mean: float | None = None, n: int = _SAMPLES, seed: int = 7) -> "TokenMix":
        """From per-request token histograms ({upper bound: count in that bucket}, as the sidecars
        export them): samples spread geometrically inside each bucket, rescaled to the observed
        means where given. Prompt and output lengths are drawn independently."""
        rng = np.random.default_rng(seed)
        prompt = _from_buckets(prompt_hist, n, prompt_mean)
        output = np.maximum(1.0, rng.permutation(_from_buckets(output_hist, n, output_mean)))
        return cls(np.maximum(1.0, prompt), output)

    @property
    def prompt_mean(self) -> float:
        return float(np.mean(self.prompt_tokens))

    @property
    def output_mean(self) -> float:
        return float(np.mean(self.output_tokens))

    def scaled(self, prompt: float = 1.0, output: float = 1.0) -> "TokenMix":
        return TokenMix(np.maximum(1.0, self.prompt_tokens * prompt), np.maximum(1.0, self.output_tokens * output))


def _from_buckets(hist: dict, n: int, mean: float | None) -> np.ndarray:
    bounds = sorted(b for b, c in hist.items() if c > 0)
    if not bounds:
        raise ValueError("a token histogram needs at least one non-empty bucket")
    edges = sorted(hist)
    total = float(sum(hist[b] for b in bounds))
    out = []
    for b in bounds:
        i = edges.index(b)
        lo = edges[i - 1] if i > 0 else max(1.0, b / 2.0)
        hi = b if math.isfinite(b) else lo * 2.0
        k = max(1, int(round(n * hist[b] / total)))
        u = (np.arange(k) + 0.5) / k
        out.append(np.exp(np.log(max(lo, 1.0)) + u * (np.log(hi) - np.log(max(lo, 1.0)))))
    values = np.concatenate(out)[:n]
    if len(values) < n:
        values = np.concatenate([values, values[: n - len(values)]])
    if mean is not None and mean > 0:
        values = values * (mean / float(np.mean(values)))
    return np.round(values)


@dataclass(frozen=True)
class Prediction:
    """One replica's steady state at one arrival rate (per replica)."""

    rate_rps: float
    stable: bool
    batch: float                  # mean decoding sequences
    step_s: float                 # decode step time at that batch
    prefill_busy: float           # share of time prefill's queue is busy (rho of the M/G/1)
    ttft_s: np.ndarray = field(repr=False)   # per sampled request (inf when unstable)
    tpot_s: np.ndarray = field(repr=False)
    output_tokens: np.ndarray = field(repr=False)

    def ttft_quantile(self, q: float) -> float:
        return float(np.quantile(self.ttft_s, q)) if self.stable else math.inf

    def tpot_quantile(self, q: float) -> float:
        """Over requests with at least two output tokens (TPOT is undefined for one)."""
        if not self.stable:
            return math.inf
        multi = self.tpot_s[self.output_tokens > 1]
        return float(np.quantile(multi, q)) if len(multi) else 0.0

    def good_share(self, slo: Slo) -> float:
        if not self.stable:
            return 0.0
        return float(np.mean((self.ttft_s <= slo.ttft_s) & (self.tpot_s <= slo.tpot_s)))


@dataclass(frozen=True, kw_only=True)
class ServiceModel:
    """One replica's service model (see the module docstring)."""

    prefill_tokens_per_s: float
    decode_base_s: float
    decode_per_seq_s: float
    kv_capacity_tokens: float
    max_batch: int
    # Prompt tokens one engine step may carry (vLLM's max_num_batched_tokens).
    step_token_budget: int
    decode_per_ctx_token_s: float = 0.0
    # What every request's TTFT includes whatever its prompt: scheduling to the next step,
    # tokenisation, the network. 0 for the simulator's fleet (it has none).
    ttft_overhead_s: float = 0.0
    # One sequence decoding alone, where that is off the line (None: a + c).
    decode_single_s: float | None = None
    # The step's concave part: d·ln(b) (a CPU's products grow sublinearly in their rows; 0 on a
    # memory-bound accelerator, where the line is the step).
    decode_log_s: float = 0.0
    # How clumped arrivals come: the index of dispersion (variance / mean) of the requests one
    # replica receives per second. 1 is Poisson; past 1 they arrive as a compound Poisson process
    # (clumps of geometric size, mean (I + 1) / 2, which has this index).
    arrival_dispersion: float = 1.0
    # How much less prompts wait than in the replica's own queue (at most 1): a load-aware router
    # pools the replicas' queues (OnlineServiceModel.wait_scale; 1 = routed at random).
    wait_scale: float = 1.0
    name: str = "model"
    source: str = ""

    def __post_init__(self) -> None:
        for f in ("prefill_tokens_per_s", "decode_base_s", "kv_capacity_tokens", "max_batch", "step_token_budget"):
            if not getattr(self, f) > 0:
                raise ValueError(f"service model {self.name!r}: {f} must be positive, got {getattr(self, f)}")
        for f in ("decode_per_seq_s", "decode_per_ctx_token_s", "ttft_overhead_s", "decode_log_s"):
            if getattr(self, f) < 0:
                raise ValueError(f"service model {self.name!r}: {f} must be >= 0, got {getattr(self, f)}")
        if self.decode_single_s is not None and not self.decode_single_s > 0:
            raise ValueError(f"service model {self.name!r}: decode_single_s must be positive, got {self.decode_single_s}")
        if not (0.0 < self.wait_scale <= 1.0):
            raise ValueError(f"service model {self.name!r}: wait_scale must be in (0, 1] (1 = each replica its own "
                             f"queue), got {self.wait_scale}")
        if not (math.isfinite(self.arrival_dispersion) and self.arrival_dispersion >= 1.0):
            raise ValueError(f"service model {self.name!r}: arrival_dispersion must be >= 1 (1 = Poisson), "
                             f"got {self.arrival_dispersion}")

    @property
    def single_step_s(self) -> float:
        """The step of one sequence decoding alone."""
        line = self.decode_base_s + self.decode_per_seq_s
        return line if self.decode_single_s is None else self.decode_single_s

    def step_s(self, batch: float, context_tokens: float = 0.0) -> float:
        """Seconds for one decode step carrying `batch` sequences holding `context_tokens` in all."""
        ctx = self.decode_per_ctx_token_s * context_tokens
        if self.decode_single_s is None or batch >= 2.0:
            return self.decode_base_s + self.decode_per_seq_s * batch + self.decode_log_s * math.log(max(batch, 1.0)) + ctx
        two = self.decode_base_s + 2.0 * self.decode_per_seq_s + self.decode_log_s * math.log(2.0)
        return self.decode_single_s + max(0.0, batch - 1.0) * (two - self.decode_single_s) + ctx

    def request_work_s(self, prompt_tokens, output_tokens, batch: float):
        """Replica-seconds one request costs when it shares decode steps with `batch` sequences:
        its prompt at the prefill rate plus its share of `output_tokens` steps."""
        return prompt_tokens / self.prefill_tokens_per_s + output_tokens * self.step_s(batch) / max(batch, 1.0)

    def to_dict(self) -> dict:
        return asdict(self)

    # -- prediction -----------------------------------------------------------------------
    def predict(self, rate_rps: float, mix: TokenMix, seed: int = 11) -> Prediction:
        p, o = mix.prompt_tokens, mix.output_tokens
        lam = max(0.0, float(rate_rps))
        p_mean, o_mean = float(np.mean(p)), float(np.mean(o))
        ctx = p_mean + o_mean / 2.0          # context a decoding sequence holds, on average
        per_seq = self.decode_per_seq_s + self.decode_per_ctx_token_s * ctx
        rho_p = lam * p_mean / self.prefill_tokens_per_s
        denom = 1.0 - rho_p - lam * o_mean * per_seq
        nan = np.full(len(p), math.inf)
        if denom <= 0:
            return Prediction(lam, False, math.inf, math.inf, 1.0, nan, nan, o)
        # The decode batch: B = λŌ·seen(B) / (1 − ρ_p), seen(B) the mean step a decoding sequence
        # takes beside B others on average (seen_step_s).
        k = lam * o_mean / (1.0 - rho_p)
        batch = float(self._decode_batch(np.array([k]), per_seq, ctx)[0])
        if not math.isfinite(batch) or batch > self.max_batch or batch * ctx > self.kv_capacity_tokens:
            return Prediction(lam, False, batch, math.inf, 1.0, nan, nan, o)
        line_one, single = self._line_one_and_single(per_seq, ctx)
        step = seen_step_s(line_one, per_seq, single, batch, self.decode_log_s)
        # Prefill as an M/G/1 queue: service = prompt time plus the decode part of each chunk's step.
        chunk = float(self.step_token_budget)
        service = p / self.prefill_tokens_per_s + (p / chunk) * step
        rho_q = lam * float(np.mean(service))
        if rho_q >= 1.0:
            return Prediction(lam, False, batch, step, 1.0, nan, nan, o)
        rng = np.random.default_rng(seed)
        if self.arrival_dispersion > 1.0 + 1e-9:
            wait, clump_p = clumped_waits(lam, service, rho_q, self.arrival_dispersion, rng, self.wait_scale)
        else:
            wait, clump_p = queue_waits(lam, service, rho_q, rng, self.wait_scale), None
        # Plus the steps every request waits through on an engine: the end of the step running when
        # it arrives (half a step on average) and the step that samples its first token.
        ttft = self.ttft_overhead_s + wait + service + 1.5 * step
        # TPOT: its own steps plus the prompt work processed while it decodes. That work is what
        # queued behind it while it waited and prefilled (arrivals during W_i + S_i: a request that
        # waited long decodes through the rest of that busy period) plus what arrives during its
        # decode; at most one full chunk per step (the backlogged engine's pace).
        tpot_mean = step / max(1e-9, 1.0 - rho_p)
        gaps = np.maximum(o - 1.0, 1.0)
        p_sd = float(np.std(p))
        window = wait + service + gaps * tpot_mean
        if clump_p is None:
            count = rng.poisson(lam * window)
        else:
            # Clumps arrive as a Poisson process, each a geometric count of requests; and the
            # members of its own clump behind it prefill while it decodes.
            clumps = rng.poisson(lam * clump_p * window)
            count = clumps + np.where(clumps > 0, rng.negative_binomial(np.maximum(clumps, 1), clump_p), 0) + \
                rng.geometric(clump_p, len(p)) - 1
        tokens = np.maximum(0.0, count * p_mean + np.sqrt(count) * p_sd * rng.standard_normal(len(p)))
        interference = np.minimum(tokens / self.prefill_tokens_per_s, gaps * chunk / self.prefill_tokens_per_s)
        # Its own steps: beside the others decoding with it, a count that follows the load over its
        # life. Those are the requests arriving in its window (counted above) and those decoding when
        # it started (a Poisson count of mean B); their ratio r to the mean is the local load, and
        # the batch it decodes in is the fluid batch at r·λ (convex in the load: a burst's batch
        # grows its step, which lengthens every decode and grows the batch again), at most everyone
        # who overlapped it where r·λ is past saturation, and never more than the engine batches.
        present = rng.poisson(batch, len(p))
        ratio = (count + present) / np.maximum(lam * window + batch, 1e-12)
        local_rho = rho_p * ratio
        local_k = np.where(local_rho < 1.0, ratio * lam * o_mean / np.maximum(1.0 - local_rho, 1e-12), np.inf)
        local_b = np.minimum(np.minimum(self._decode_batch(local_k, per_seq, ctx), (count + present).astype(float)),
                             float(self.max_batch))
        # It decodes alone throughout with probability e^(−b), b its local batch (the share of time
        # a sequence has no other beside it; 1 where no one overlapped it), at `decode_single_s`;
        # otherwise on the curve beside the others: step(1 + K) given K >= 1, K ~ Poisson(b).
        p_alone = np.exp(-local_b)
        beside = (per_seq * local_b + self.decode_log_s * log_one_plus_poisson(local_b)) / np.maximum(1.0 - p_alone, 1e-12)
        own = np.where(rng.random(len(p)) < p_alone, single, line_one + beside)
        tpot = np.where(o > 1, own + interference / gaps, 0.0)
        return Prediction(lam, True, batch, step, rho_q, ttft, tpot, o)

    def _line_one_and_single(self, per_seq: float, ctx: float) -> tuple[float, float]:
        """The step of one sequence holding `ctx` context tokens: on the line, and alone."""
        return self.decode_base_s + per_seq, self.single_step_s + self.decode_per_ctx_token_s * ctx

    def _decode_batch(self, k: np.ndarray, per_seq: float, ctx: float) -> np.ndarray:
        """The time-average decode batch B = k·seen(B), k = λŌ / (1 − ρ_p) (tokens a second of
        decoding must produce); inf where no batch keeps up (k·c' >= 1). On the line the root is
        closed form; with a one-sequence step off it or a concave part, a safeguarded Newton's
        method on g(B) = k·seen(B) − B, which is positive below the root and negative above it
        (seen(B) grows slower than B / k), inside a bracket that each iterate narrows."""
        k = np.asarray(k, float)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(k) & (k * per_seq < 1.0)
        kk = np.where(ok, k, 0.0)
        denom = np.where(ok, 1.0 - kk * per_seq, 1.0)
        line_one, single = self._line_one_and_single(per_seq, ctx)
        off = single - line_one
        d = self.decode_log_s
        if off == 0.0 and d == 0.0:
            return np.where(ok, kk * line_one / denom, np.inf)
        # Bracket: seen(B) >= line_one + c'·B + min(off, 0), and seen(B) <= line_one + c'·B +
        # max(off, 0) + d·ln(1 + B) <= ... + d·(ln(1 + B0) + (B − B0) / (1 + B0)) for any B0 (a
        # tangent of the concave log), B0 past the engine's batch limit.
        lo = kk * (line_one + min(off, 0.0)) / denom
        b0 = 2.0 * float(self.max_batch)
        slope_hi = per_seq + d / (1.0 + b0)
        with np.errstate(divide="ignore", invalid="ignore"):
            hi = np.where(kk * slope_hi < 1.0, kk * (line_one + per_seq + max(off, 0.0) + d * (math.log1p(b0) - b0 / (1.0 + b0)))
                          / np.maximum(1.0 - kk * slope_hi, 1e-300), np.inf)
        hi = np.maximum(np.minimum(hi, 1e9), lo)
        b = np.minimum(hi, np.maximum(lo, kk * (line_one + per_seq) / denom))
        for _ in range(30):
            e = np.exp(-b)
            g = kk * (line_one + per_seq * b + d * log_one_plus_poisson(b) + e * off) - b
            lo = np.where(g >= 0.0, b, lo)
            hi = np.where(g <= 0.0, b, hi)
            slope = kk * (per_seq + d * log_one_plus_poisson_slope(b) - e * off) - 1.0
            with np.errstate(divide="ignore", invalid="ignore"):
                newton = b - g / slope
            nxt = np.where(np.isfinite(newton) & (newton > lo) & (newton < hi), newton, 0.5 * (lo + hi))
            done = np.max(np.abs(nxt - b)) <= 1e-9 * (1.0 + float(np.max(nxt)))
            b = nxt
            if done:
                break
        return np.where(ok, b, np.inf)

    def feasible_shares(self, mix: TokenMix, slos) -> dict[str, float]:
        idle = self.predict(1e-9, mix)
        return {s.name: idle.good_share(s) for s in slos}

    def meets_slo(self, rate: float, mix: TokenMix, slos, feasible: dict[str, float] | None = None) -> bool:
        """Whether one replica at `rate` req/s meets every class's objectives (for the share of
        requests an idle replica would serve in time; see slo_capacity_rps)."""
        feasible = self.feasible_shares(mix, slos) if feasible is None else feasible
        pred = self.predict(rate, mix)
        return pred.stable and all(pred.good_share(s) >= s.ratio * feasible[s.name] - 1e-12 for s in slos)

    def slo_capacity_rps(self, mix: TokenMix, slos: list[Slo] | tuple[Slo, ...], hi: float | None = None) -> float:
        """The highest per-replica arrival rate at which every class meets its objectives for
        `ratio` of the requests an idle replica would serve in time (all classes share the
        replica's load). Bisection over the rate."""
        if not slos:
            raise ValueError("slo_capacity_rps needs at least one SLO class")
        # Requests that miss even on an idle replica (a prompt too long to prefill within the TTFT
        # objective) are no capacity problem: no number of replicas serves them in time, so the
        # objective ratio applies to the share an idle replica would serve.
        feasible = self.feasible_shares(mix, slos)

        def meets(rate: float) -> bool:
            return self.meets_slo(rate, mix, slos, feasible)

        # Upper end: the fluid saturation rate, where prompt time plus per-sequence decode time
        # fill the replica (the denominator of predict()'s batch reaches 0).
        if hi is None:
            ctx = mix.prompt_mean + mix.output_mean / 2.0
            per_seq = self.decode_per_seq_s + self.decode_per_ctx_token_s * ctx
            busy = mix.prompt_mean / self.prefill_tokens_per_s + mix.output_mean * per_seq
            hi = 1.0 / max(busy, 1e-9)
        if not meets(1e-6):
            return 0.0
        lo = 0.0
        for _ in range(30):
            mid = (lo + hi) / 2
            if meets(mid):
                lo = mid
            else:
                hi = mid
            if hi - lo < 1e-4 * max(hi, 1e-6):
                break
        return lo


def seen_step_s(line_one, per_seq, single, others, log_coef: float = 0.0):
    """The mean step a decoding sequence takes beside `others` sequences on average (a Poisson
    count K): the step at 1 + K (`line_one` its value at one sequence, `per_seq` the line's slope,
    `log_coef` its concave part d·ln(1 + K)), less what it saves the share e^(−others) of its steps
    it decodes alone at `single` (nothing when that is on the line). Scalars or arrays."""
    mean = line_one + per_seq * others + np.exp(-others) * (single - line_one)
    return mean + log_coef * log_one_plus_poisson(others) if log_coef else mean


# E[ln(1 + K)] for K ~ Poisson(m), and its derivative in m (E[ln(2 + K) − ln(1 + K)]), tabulated
# on [0, _LOG_TABLE_MAX] (linear interpolation: error < 1e-4) and from the asymptotic expansion
# past it (error < 1e-6 there).
_LOG_TABLE_MAX = 256.0
_LOG_TABLE_STEP = 1.0 / 32.0


def _log_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    m = np.arange(0.0, _LOG_TABLE_MAX + _LOG_TABLE_STEP / 2, _LOG_TABLE_STEP)
    ks = np.arange(0, int(_LOG_TABLE_MAX + 12 * math.sqrt(_LOG_TABLE_MAX) + 20), dtype=float)
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(ks[1:]))])
    mean, slope = np.zeros(len(m)), np.zeros(len(m))
    slope[0] = math.log(2.0)
    for i in range(1, len(m), 512):
        mm = m[i:i + 512, None]
        pmf = np.exp(ks[None, :] * np.log(mm) - mm - log_fact[None, :])
        mean[i:i + 512] = pmf @ np.log1p(ks)
        slope[i:i + 512] = pmf @ np.log1p(1.0 / (1.0 + ks))
    return m, mean, slope


_LOG_M, _LOG_MEAN, _LOG_SLOPE = _log_tables()


def log_one_plus_poisson(m):
    """E[ln(1 + K)], K ~ Poisson(m) (m >= 0; scalars or arrays)."""
    m = np.maximum(np.asarray(m, float), 0.0)
    far = np.log1p(m) - m / (2.0 * (1.0 + m) ** 2)
    return np.where(m <= _LOG_TABLE_MAX, np.interp(m, _LOG_M, _LOG_MEAN), far)


def log_one_plus_poisson_slope(m):
    """d/dm E[ln(1 + K)] = E[ln((2 + K) / (1 + K))], K ~ Poisson(m)."""
    m = np.maximum(np.asarray(m, float), 0.0)
    far = 1.0 / (1.0 + m) - (1.0 - m) / (2.0 * (1.0 + m) ** 3)
    return np.where(m <= _LOG_TABLE_MAX, np.interp(m, _LOG_M, _LOG_SLOPE), far)


__all__ = ["Slo", "TokenMix", "Prediction", "ServiceModel"]
