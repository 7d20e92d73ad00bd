"""Learning one replica's service model online, from what the fleet already exports.

Every forecast step turns the fleet's counters and gauges into per-replica observations:
- decode: the step time y = TPOT · (1 − ρ_p) (TPOT from the sidecars' histograms, ρ_p the share
  of time the replica spends on prompt tokens) against the batch x = running requests per replica,
  fitted as y = a + c·x by weighted least squares with exponential forgetting (recent steps count
  more; a weak prior keeps the slope sane while the batch has not moved);
- prefill: the rate P̄ / S̄, where S̄ is the prefill time of a mean prompt: from the engine's own
  per-request prefill histogram when it exports one (vLLM's `request_prefill_time_seconds`,
  normalised by the sidecar), else TTFT minus the queue wait that Little's law gives from the
  engine's waiting gauge (W = waiting / arrival rate), minus half a step;
- KV capacity: tokens held (running × (P̄ + Ō/2)) over the KV usage ratio, once usage is >= 5 %;
- the token mix: mean prompt and output tokens per ended request.

Nothing is configured but the SLO. An optional prior (a `goodput bench engine --json` result or a
ServiceModel) seeds the fit; without one the model is `ready` only after `min_steps` steps with
finished requests, and callers fall back to their request-rate capacity until then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from forecaster.service_model import ServiceModel, TokenMix

_Z90 = 1.645


@dataclass(frozen=True)
class StepObservation:
    """One forecast step's per-replica view (rates over the step; gauges at its end)."""

    dt: float
    replicas: int
    arrival_rps: float            # whole fleet
    ended: float                  # requests that ended in the step (whole fleet)
    input_tokens: float           # prompt tokens of those
    output_tokens: float
    ttft_sum: float | None = None
    ttft_count: float | None = None
    tpot_sum: float | None = None
    tpot_count: float | None = None
    running: float = 0.0          # whole fleet, at the step's end
    waiting: float = 0.0
    kv_usage: float = math.nan    # mean over replicas
    prefill_sum: float | None = None    # engine-reported prefill seconds (whole fleet)
    prefill_count: float | None = None


@dataclass(frozen=True)
class FittedParams:
    """The learned parameters with a 90 % band each (for export and dashboards)."""

    model: ServiceModel
    decode_base_s: tuple[float, float]
    decode_per_seq_s: tuple[float, float]
    prefill_tokens_per_s: tuple[float, float]
    kv_capacity_tokens: tuple[float, float]
    prompt_mean: float
    output_mean: float
    num_steps: int


class OnlineServiceModel:
    def __init__(self, prior: ServiceModel | None = None, half_life_steps: float = 120.0,
                 min_steps: int = 3, step_token_budget: int = 512, max_batch: int = 256,
                 prior_weight: float = 2.0):
        self.prior = prior
        self.forget = 0.5 ** (1.0 / max(1.0, half_life_steps))
        self.min_steps = min_steps
        self.step_token_budget = prior.step_token_budget if prior else step_token_budget
        self.max_batch = prior.max_batch if prior else max_batch
        self.prior_weight = prior_weight
        # Weighted least squares state for y = a + c x: sums of w, wx, wy, wxx, wxy, wyy.
        self._s = np.zeros(6)
        self._seeded = False
        # Prefill rate and KV capacity: exponentially weighted mean and variance of log estimates.
        self._pf = [0.0, 0.0, 0.0]   # sum w, sum w·log, sum w·log²
        self._kv = [0.0, 0.0, 0.0]
        self._mix = [0.0, 0.0, 0.0]  # sum w (requests), prompt tokens, output tokens
        self.num_steps = 0
        if prior is not None:
            self._seed(prior)

    # -- inputs ---------------------------------------------------------------------------
    def _seed(self, m: ServiceModel) -> None:
        w = self.prior_weight
        for x in (1.0, 16.0):  # two pseudo-points on the prior's line pin both coefficients
            self._add_decode(x, m.step_s(x), w / 2)
        self._add_log(self._pf, m.prefill_tokens_per_s, w)
        if math.isfinite(m.kv_capacity_tokens) and m.kv_capacity_tokens < 1e15:
            self._add_log(self._kv, m.kv_capacity_tokens, w)
        self._seeded = True

    def _add_decode(self, x: float, y: float, w: float) -> None:
        self._s += w * np.array([1.0, x, y, x * x, x * y, y * y])

    @staticmethod
    def _add_log(acc: list, value: float, w: float) -> None:
        v = math.log(value)
        acc[0] += w
        acc[1] += w * v
        acc[2] += w * v * v

    def _decay(self) -> None:
        f = self.forget
        self._s *= f
        for acc in (self._pf, self._kv, self._mix):
            for i in range(3):
                acc[i] *= f

    def observe(self, o: StepObservation) -> None:
        if o.replicas <= 0 or o.dt <= 0 or not (o.ended > 0):
            return
        self._decay()
        r = float(o.replicas)
        if o.input_tokens >= 0 and o.output_tokens > 0:
            self._mix[0] += o.ended
            self._mix[1] += o.input_tokens
            self._mix[2] += o.output_tokens
        p_mean, o_mean = self.mix_means()
        lam_r = max(0.0, o.arrival_rps) / r
        batch = max(0.0, o.running) / r
        a, c = self._decode_coeffs()
        step_guess = a + c * max(batch, 1.0) if a is not None else None
        # Prefill: engine-reported prefill time when available, else TTFT less the queue wait.
        prefill_s = None
        if o.prefill_count and o.prefill_sum is not None and o.prefill_count > 0:
            prefill_s = o.prefill_sum / o.prefill_count
        elif o.ttft_count and o.ttft_sum is not None and o.ttft_count > 0:
            wait = (max(0.0, o.waiting) / r) / lam_r if lam_r > 0 else 0.0
            prefill_s = o.ttft_sum / o.ttft_count - wait - 0.5 * (step_guess or 0.0)
        if prefill_s is not None and p_mean > 0:
            chunks = math.ceil(p_mean / self.step_token_budget)
            pure = prefill_s - chunks * (step_guess or 0.0)
            if pure > 1e-6:
                # Down-weight steps with a queue: Little's law over 15 s is noisy there.
                w = float(o.ttft_count or o.prefill_count or 1.0) / (1.0 + max(0.0, o.waiting) / r)
                self._add_log(self._pf, p_mean / pure, w)
        # Decode: TPOT net of the time prompts took from it.
        if o.tpot_count and o.tpot_sum is not None and o.tpot_count > 0:
            tpot = o.tpot_sum / o.tpot_count
            pf_rate = self.prefill_rate()
            rho_p = min(0.9, lam_r * p_mean / pf_rate) if pf_rate else 0.0
            y = tpot * (1.0 - rho_p)
            if y > 0 and math.isfinite(y):
                self._add_decode(max(batch, 1.0), y, float(o.tpot_count))
        if math.isfinite(o.kv_usage) and o.kv_usage >= 0.05 and batch > 0:
            self._add_log(self._kv, batch * (p_mean + o_mean / 2.0) / o.kv_usage, 1.0)
        self.num_steps += 1

    # -- estimates ------------------------------------------------------------------------
    def mix_means(self) -> tuple[float, float]:
        n, p, o = self._mix
        if n <= 0:
            return 0.0, 0.0
        return p / n, max(1.0, o / n)

    def _decode_coeffs(self) -> tuple[float | None, float]:
        w, sx, sy, sxx, sxy, _ = self._s
        if w <= 0:
            return None, 0.0
        mx, my = sx / w, sy / w
        var = sxx / w - mx * mx
        if var > 1e-9:
            c = max(0.0, (sxy / w - mx * my) / var)
        else:
            # One batch size seen so far: a weak prior slope (a step doubles by batch 32; measured
            # engines lie between 1/8 (SmolLM2 on CPU) and 1/70 (70B on H100) of the base per sequence).
            c = 0.0 if self._seeded else (my / 33.0)
        a = max(1e-4, my - c * mx)
        return a, c

    def _decode_band(self) -> tuple[tuple[float, float], tuple[float, float]]:
        w, sx, sy, sxx, sxy, syy = self._s
        a, c = self._decode_coeffs()
        if a is None or w <= 0:
            return (math.nan, math.nan), (math.nan, math.nan)
        mx = sx / w
        sxx_c = sxx - w * mx * mx
        resid = max(0.0, syy - 2 * a * sy - 2 * c * sxy + a * a * w + 2 * a * c * sx + c * c * sxx)
        s2 = resid / max(w - 2.0, 1.0)
        se_c = math.sqrt(s2 / sxx_c) if sxx_c > 1e-9 else c
        se_a = math.sqrt(s2 * (1.0 / w + (mx * mx / sxx_c if sxx_c > 1e-9 else 0.0)))
        return ((max(1e-4, a - _Z90 * se_a), a + _Z90 * se_a), (max(0.0, c - _Z90 * se_c), c + _Z90 * se_c))

    @staticmethod
    def _log_mean(acc) -> tuple[float | None, float]:
        w, s, ss = acc
        if w <= 0:
            return None, 0.0
        m = s / w
        sd = math.sqrt(max(0.0, ss / w - m * m))
        return m, sd

    def prefill_rate(self) -> float | None:
        m, _ = self._log_mean(self._pf)
        return math.exp(m) if m is not None else None

    @property
    def ready(self) -> bool:
        return self._seeded or (self.num_steps >= self.min_steps and self.prefill_rate() is not None
                                and self._decode_coeffs()[0] is not None)

    def model(self) -> ServiceModel | None:
        if not self.ready:
            return None
        a, c = self._decode_coeffs()
        pf = self.prefill_rate()
        kv_m, _ = self._log_mean(self._kv)
        kv = math.exp(kv_m) if kv_m is not None else (self.prior.kv_capacity_tokens if self.prior else 1e12)
        return ServiceModel(prefill_tokens_per_s=pf, decode_base_s=a, decode_per_seq_s=c, kv_capacity_tokens=kv,
                            max_batch=self.max_batch, step_token_budget=self.step_token_budget,
                            name="learned", source=f"learned online over {self.num_steps} steps")

    def mix(self) -> TokenMix | None:
        p, o = self.mix_means()
        if p <= 0:
            return None
        return TokenMix.from_means(p, o)

    def params(self) -> FittedParams | None:
        m = self.model()
        if m is None:
            return None
        (a_lo, a_hi), (c_lo, c_hi) = self._decode_band()
        pf_m, pf_sd = self._log_mean(self._pf)
        kv_m, kv_sd = self._log_mean(self._kv)
        kv_band = (math.exp(kv_m - _Z90 * kv_sd), math.exp(kv_m + _Z90 * kv_sd)) if kv_m is not None else (math.nan, math.nan)
        p, o = self.mix_means()
        return FittedParams(m, (a_lo, a_hi), (c_lo, c_hi),
                            (math.exp(pf_m - _Z90 * pf_sd), math.exp(pf_m + _Z90 * pf_sd)), kv_band, p, o,
                            self.num_steps)


def model_from_bench(bench: dict, step_token_budget: int = 512, max_batch: int = 256,
                     kv_capacity_tokens: float = 1e12) -> ServiceModel:
    """A prior from `goodput bench engine --json`: step(b) fitted to its decode points, prefill
    from its prefill run."""
    points = [(float(d["batch"]), float(d["step_s"])) for d in bench.get("engine_decode", [])]
    if len(points) < 2 or "engine_prefill" not in bench:
        raise ValueError("a bench result needs engine_decode at two or more batch sizes and engine_prefill")
    x = np.array([b for b, _ in points])
    y = np.array([s for _, s in points])
    c, a = np.polyfit(x, y, 1)
    return ServiceModel(prefill_tokens_per_s=float(bench["engine_prefill"]["tokens_per_s"]),
                        decode_base_s=max(1e-4, float(a)), decode_per_seq_s=max(0.0, float(c)),
                        kv_capacity_tokens=kv_capacity_tokens, max_batch=max_batch,
                        step_token_budget=step_token_budget, name="bench",
                        source=f"goodput bench engine ({bench.get('model', '?')})")


__all__ = ["StepObservation", "FittedParams", "OnlineServiceModel", "model_from_bench"]
