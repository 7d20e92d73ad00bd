"""Learning one replica's service model online, from what the fleet already exports.

Every forecast step turns the fleet's counters and gauges into per-replica observations:
- decode: the step time y = TPOT · (1 − ρ_p) (TPOT from the sidecars' histograms, ρ_p the share
  of time the replica spends on prompt tokens) against the batch x = running requests per replica,
  and, where the engines export iteration and generated-token counters (vLLM's
  iteration_tokens_total, generation_tokens_total), the mean iteration time against the mean batch
  per iteration of this very step (it moves as soon as the batch does; TPOT waits for requests to end;
  net of the prompt tokens the engines counted as prefilled in the step, vLLM's prompt_tokens_total),
  fitted as y = a + c·x + d·z (z = ln x for iterations, E[ln(1 + K)] for TPOT's Poisson count of
  others; c, d >= 0) by weighted least squares with exponential forgetting (recent steps count
  more; a weak prior keeps the slope sane while the batch has not moved, a ridge holds d at 0
  until the points bend); and the step of one
  sequence decoding alone, which can lie well off that line (a CPU runs a one-row product as a
  matrix-vector kernel): from TPOT at low load, where a share p₀ = e^(−B) of the decoding is alone,
  by inverting the model's mean step, seen(B) + p₀·(single − step(1)), on the mean TPOT net of
  prompt work, B the others beside the requests that ended (the running gauge less those requests
  themselves; steps with p₀ >= 0.2 only, weighted by p₀²; the weighted median of the recent);
- prefill: per step, the seconds a prompt token occupies the model's M/G/1 prompt queue that make
  its mean W + S match the mean TTFT at the observed arrival rate (or, where the engine splits
  them, its queue + prefill time: vLLM's `request_queue_time_seconds` and
  `request_prefill_time_seconds`, normalised by the sidecar), against the step's mean prompt length,
  fitted as a robust line: its slope is the time a prompt token occupies the prefill queue (the
  prefill rate once the decode part of its chunks' steps is taken off), its intercept the fixed
  part of TTFT every request pays (scheduling, tokenisation, network);
- how clumped arrivals come: the sidecars count, per window of 0.1, 1 and 10 s, the sum of the
  squared arrivals (goodput_requests_arrived_squared_total); per step, each window's variance of
  the counts about the step's own mean, over the arrivals, is its index of dispersion (pooled with
  forgetting; read at a prompt's mean service time), which the prefill inversion above and the
  model's M^X/G/1 prompt queue take in;
- KV capacity: tokens held (running × (P̄ + Ō/2)) over the KV usage ratio, once usage is >= 5 %;
- the token mix: mean prompt and output tokens per ended request.

Nothing is configured but the SLO. An optional prior (a `goodput bench engine --json` result or a
ServiceModel) seeds the fit; without one the model is `ready` only after `min_steps` steps with
finished requests, and callers fall back to their request-rate capacity until then.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

import numpy as np

from forecaster.fleet_sample import StepObservation
from forecaster.fitted_params import FittedParams
from forecaster.wait_scale import WaitScale
from forecaster.robust_line import RobustLine, weighted_median
from forecaster.prompt_queue import ArrivalClumping, service_per_token
from forecaster.service_model import ServiceModel, TokenMix, log_one_plus_poisson, seen_step_s

_Z90 = 1.645
# The token budget a step assumed when the engine's is not known: vLLM's max_num_batched_tokens
# (V1: 8192 on large GPUs, 2048 elsewhere; the bundled engine's is 512). It bounds the prompt work
# one decode step carries, so how far a long prompt can stretch other requests' TPOT.
_DEFAULT_BUDGET = 2048
_PRIOR_XS = (1.0, 4.0)   # a prior's decode evidence, where unmeasured: little leverage on the slope


class OnlineServiceModel:
    def __init__(self, prior: ServiceModel | None = None, half_life_steps: float = 120.0,
                 min_steps: int = 8, step_token_budget: int | None = None, max_batch: int = 256,
                 prior_weight: float = 2.0, max_points: int = 720, prior_batches: tuple = ()):
        self.prior = prior
        self.forget = 0.5 ** (1.0 / max(1.0, half_life_steps))
        self.min_steps = min_steps
        # The engine's token budget a step (vLLM's max_num_batched_tokens) is not exported; unless
        # given, the decode part of a prompt's chunk steps stays folded into the learned prefill
        # rate (measured at the batch the fleet runs), and prompts are not split into chunks.
        self.step_token_budget = prior.step_token_budget if prior else step_token_budget
        self.max_batch = prior.max_batch if prior else max_batch
        self.prior_weight = prior_weight
        # The prior's evidence sits where its steps were measured (a bench's batches), else _PRIOR_XS.
        self._prior_xs = tuple(sorted({float(b) for b in prior_batches if b >= 1})) or _PRIOR_XS
        self._decode = RobustLine(self.forget, max_points)        # step against batch, from engine iterations
        self._decode_tpot = RobustLine(self.forget, max_points)   # from TPOT, where there are none
        self._seeded = False
        # Prefill (seconds a prompt token occupies the prefill queue), the fixed TTFT overhead and
        # KV capacity: exponentially weighted mean and variance (of logs, for the first and last).
        # Per-token prefill time estimates (log k, weight, step). Queueing only ever adds to an
        # estimate (prompts waiting behind others' chunks count as prefill time), in bursts, so
        # the estimate is the weighted median of the recent ones, not their mean.
        self._pf: deque = deque(maxlen=max_points)
        self._pf_prior: tuple[float, float] | None = None   # (log k, weight)
        # One sequence decoding alone: per step (mean TPOT net of prompt work, batch, weight, step).
        self._single: deque = deque(maxlen=max_points)
        self._single_prior: tuple[float, float] | None = None
        self._single_cache = None
        self._overhead = [0.0, 0.0, 0.0]
        self._kv = [0.0, 0.0, 0.0]
        self._mix = [0.0, 0.0, 0.0]  # sum w (requests), prompt tokens, output tokens
        # Engine queue time over the model's M/G/1 wait, on calm steps (forecaster/wait_scale.py).
        self._wait = WaitScale()
        self._hist = ({}, {})         # decayed per-request token histograms (prompt, output), where exported
        # How clumped arrivals come, from the sidecars' per-window counters (forecaster/prompt_queue.py).
        self.clumping = ArrivalClumping()
        self.num_steps = 0
        if prior is not None:
            self._seed(prior)

    def _seed(self, m: ServiceModel) -> None:
        w = self.prior_weight
        self._decode.set_prior(self._prior_xs, m.decode_base_s, m.decode_per_seq_s, w, m.decode_log_s)
        self._decode_tpot.set_prior(self._prior_xs, m.decode_base_s, m.decode_per_seq_s, w, m.decode_log_s)
        self._pf_prior = (math.log(1.0 / m.prefill_tokens_per_s + m.step_s(1.0) / m.step_token_budget), w)
        if m.decode_single_s is not None:
            self._single_prior = (math.log(m.decode_single_s), w)
        if math.isfinite(m.kv_capacity_tokens) and m.kv_capacity_tokens < 1e15:
            self._add_log(self._kv, m.kv_capacity_tokens, w)
        if m.ttft_overhead_s > 0:
            self._add_lin(self._overhead, m.ttft_overhead_s, w)
        self._seeded = True

    def _add_decode(self, x: float, y: float, w: float, line: RobustLine | None = None, z: float = 0.0) -> None:
        line = self._decode if line is None else line
        if not line.has_prior:
            # No prior given: a weak one from the first step seen, with the conservative end of
            # measured engines' slopes (a step grows 1/8 of its base per sequence: SmolLM2 on CPU;
            # a 70B model on H100 grows 1/70), so capacity is under- rather than overstated until
            # the batch has varied enough to show the real slope. Pseudo-points at batch 1 and 4:
            # close together, so little leverage on the slope once batches vary.
            base = y / (1.0 + x / 8.0)
            line.set_prior(_PRIOR_XS, base, base / 8.0, self.prior_weight)
        line.add(x, y, w, self.num_steps, z)

    @staticmethod
    def _add_log(acc: list, value: float, w: float) -> None:
        v = math.log(value)
        acc[0] += w
        acc[1] += w * v
        acc[2] += w * v * v

    def _decay(self) -> None:
        f = self.forget
        for acc in (self._overhead, self._kv, self._mix):
            for i in range(3):
                acc[i] *= f
        self._wait.decay(f)
        self.clumping.decay(f)
        for hist in self._hist:
            for k in hist:
                hist[k] *= f

    def observe(self, o: StepObservation, calm: bool = True) -> None:
        """Learn from one step. `calm`: no burst in the arrivals' recent memory (the policy's burst
        test); only calm steps teach the wait scale."""
        if o.replicas <= 0 or o.dt <= 0 or not (o.ended > 0):
            return
        self._decay()
        r = float(o.replicas)
        for hist, step_hist in zip(self._hist, (o.input_hist, o.output_hist)):
            for bound, count in (step_hist or {}).items():
                hist[bound] = hist.get(bound, 0.0) + count
        if o.input_tokens >= 0 and o.output_tokens > 0:
            self._mix[0] += o.ended
            self._mix[1] += o.input_tokens
            self._mix[2] += o.output_tokens
        self.clumping.observe(o.arrivals_squared, o.arrivals, r, o.dt)
        p_mean, o_mean = self.mix_means()
        dispersion = self.arrival_dispersion()
        # The load the requests that ended in this step met: the rate they leave at, not the rate new
        # ones arrive at. Their TTFT and TPOT were formed over the seconds before they ended; a step's
        # arrivals can have stopped (or begun) meanwhile. Inverting the prompt queue at no arrivals
        # would read the waiting these requests did as a slow prefill. In a steady state both agree.
        lam_r = o.ended / o.dt / r
        batch = max(0.0, o.running) / r
        # Decode first: TPOT net of the time prompts took from it (at the prefill rate known so far),
        # unless the engines' iteration counters are usable this step (below): that is the sharper
        # measurement, since a step's TPOT averages requests that lived through several batches.
        # Iterations are used only from steps where the batch cannot have emptied (idle time would
        # read as a slower step): fewer requests ended in the step than were running at its start,
        # so one of those ran throughout, and the engine stepped all along. (Two or more running at
        # both ends is not enough: at low load a request lives a second or two of a 5-s step, and
        # such steps read 74 ms where TPOT said 35.)
        iterations = bool(o.engine_steps and o.generated_tokens and o.engine_steps > 0 and o.replicas == 1
                          and o.running_start >= 1.0 and o.ended < o.running_start
                          and min(o.running_start, o.running) >= 2 * r)
        tpot_net = None
        # The batch those TPOTs were measured at, where the sidecars count it per request (itself
        # included); else the running gauge at the step's ends, an instant's count whose noise
        # flattens the fitted slope (live step test: 2.2-2.7 ms a sequence against the engine's 5).
        seen = o.decode_batch_sum / o.decode_batch_count if (o.decode_batch_count or 0) > 0 and o.decode_batch_sum is not None else None
        others = max(0.0, seen - 1.0) if seen is not None else batch
        if o.tpot_count and o.tpot_sum is not None and o.tpot_count > 0:
            tpot = o.tpot_sum / o.tpot_count
            y = tpot - self._interference(lam_r, tpot)
            if y > 0 and math.isfinite(y):
                tpot_net = y
                # A decoding request steps beside the batch's others, a Poisson count of mean B:
                # at 1 + B on average, its step's concave part E[ln(1 + K)]. Learned on steps read
                # from iterations too: it stands in until those have five points, and the prefill
                # below is read net of its step (left empty, a whole TTFT read as prefill once).
                self._add_decode(1.0 + others, y, float(o.tpot_count), self._decode_tpot,
                                 float(log_one_plus_poisson(others)))
        # The engines' own counters say the step time at the batch this very step ran: iterations
        # and generated tokens give the mean batch per iteration (B̄ = tokens / iterations) and,
        # while the batch never empties, the mean iteration time (replica-seconds / iterations,
        # net of prompt compute), without waiting for requests to end as TPOT does.
        if iterations:
            mean_batch = o.generated_tokens / o.engine_steps
            pf_rate = self.prefill_rate()
            # The prompt work this step's iterations carried: what the engines prefilled in it where
            # they count that, else the prompts of the requests that ended (which lag by a lifetime).
            prompts = o.prefilled_tokens if o.prefilled_tokens is not None else o.input_tokens
            prompt_s = (prompts / pf_rate) if pf_rate else 0.0
            y = (o.dt * r - prompt_s) / o.engine_steps
            if math.isfinite(y) and y > 0 and mean_batch >= 1.0:
                self._add_decode(mean_batch, y, max(1.0, float(o.tpot_count or o.ended)), z=math.log(mean_batch))
        if tpot_net is not None:
            self._add_single(tpot_net, self._others(o, tpot_net) if seen is None else others, float(o.tpot_count))
        step = self._mean_step(batch) if self._decode_coeffs()[0] is not None else 0.0
        # Prefill: the seconds a prompt token occupies the prefill queue (its compute plus its
        # share of its chunks' steps). Where the engines time their requests' phases (vLLM's
        # request_queue_time / request_prefill_time, normalised by the sidecar), from the prefill
        # time itself, and what TTFT holds beyond queue + prefill is the fixed overhead
        # (tokenisation, the network, the proxy); else by inverting the model's own M/G/1 prefill
        # queue at the observed arrival rate on the mean TTFT, net of the overhead known so far.
        k = None
        ttft_mean = o.ttft_sum / o.ttft_count if (o.ttft_count and o.ttft_sum is not None) else None
        if o.prefill_count and o.prefill_sum is not None and o.prefill_count > 0 and p_mean > 0:
            prefill_mean = o.prefill_sum / o.prefill_count
            queue_mean = o.queue_sum / o.queue_count if (o.queue_count and o.queue_sum is not None) else None
            if queue_mean is not None:
                # Queue + prefill, as the engine splits them, is the model's W + S(P) + 1.5 steps:
                # the rest of the step running at arrival, the prompt queue (prompts scheduled in
                # the same step share it, so a prompt's prefill time holds its neighbours' compute
                # too: dividing it by its own tokens would overstate the cost of a token by the
                # prompts a step carries), its own compute, and the step that samples its first
                # token. So the same M/G/1 inversion as from TTFT, on the engine's own clock.
                net = max(queue_mean + prefill_mean - 1.5 * step, 0.1 * prefill_mean)
                m2 = self._prompt_m2(p_mean)
                k = service_per_token(net, lam_r, p_mean, m2, dispersion)
                if calm:
                    self._add_wait(queue_mean, lam_r, p_mean, m2, dispersion, float(o.queue_count))
                if ttft_mean is not None:
                    extra = ttft_mean - queue_mean - prefill_mean
                    self._add_lin(self._overhead, max(0.0, extra), float(o.ttft_count))
            else:
                # The prefill time alone runs from scheduling to the first token: it holds the
                # step that samples that token, which service_model.predict counts on its own.
                k = max(prefill_mean - step, 0.1 * prefill_mean) / p_mean
        elif ttft_mean is not None and p_mean > 0:
            # TTFT less the steps every request waits through (predict counts 1.5 of them).
            net = max(ttft_mean - self.ttft_overhead_s() - 1.5 * step, 0.1 * ttft_mean)
            k = service_per_token(net, lam_r, p_mean, self._prompt_m2(p_mean), dispersion)
        if k is not None and k > 0:
            # Down-weight steps with a queue: those are transients more than steady state.
            w = float(o.ttft_count or o.prefill_count or 1.0) / (1.0 + max(0.0, o.waiting) / r)
            self._pf.append((math.log(k), w, self.num_steps))
        if math.isfinite(o.kv_usage) and o.kv_usage >= 0.05 and batch > 0:
            self._add_log(self._kv, batch * (p_mean + o_mean / 2.0) / o.kv_usage, 1.0)
        self.num_steps += 1

    def _add_wait(self, queue_mean: float, lam_r: float, p_mean: float, m2: float, dispersion: float,
                  w: float) -> None:
        """One step's engine queue time over the model's mean wait at its rate per replica
        (service_model.predict's prompt queue, clump members ahead taken out of both; `m2` is
        E[P²] of the prompts)."""
        k, _ = self._per_token_k()
        if k is None or not (w > 0):
            return
        rho = lam_r * k * p_mean
        if not (0.0 < rho < 0.95):
            return
        clumped_m2 = m2 + max(0.0, dispersion - 1.0) * p_mean * p_mean
        predicted = lam_r * k * k * clumped_m2 / (2.0 * (1.0 - rho))
        observed = max(0.0, queue_mean - max(0.0, dispersion - 1.0) / 2.0 * p_mean * k)
        self._wait.add(observed, predicted, w)

    def wait_scale(self) -> float:
        """How much less the fleet's prompts wait than the model's per-replica queue says
        (forecaster/wait_scale.py): 1 while unknown, at most 1."""
        return self._wait.value()

    @staticmethod
    def _others(o: StepObservation, tpot: float) -> float:
        """The mean count of others decoding beside the requests that ended in the step: the
        running gauge at its two ends, less the ended requests themselves at the start (each was
        running there if it began before the step: with a life L, a share min(1, L / dt) of those
        ending at a uniform time in the step did). At low load a request lives a few seconds, and
        counting itself as its own neighbour reads a request decoding alone as one in a batch."""
        r = float(o.replicas)
        ttft = o.ttft_sum / o.ttft_count if (o.ttft_count and o.ttft_sum is not None) else 0.0
        out = o.output_tokens / o.ended if o.ended > 0 else 1.0
        life = ttft + max(0.0, out - 1.0) * tpot
        start = max(0.0, o.running_start - o.ended * min(1.0, life / o.dt))
        end = max(0.0, 2.0 * o.running - o.running_start)
        return 0.5 * (start + end) / r

    def _add_single(self, tpot_net: float, batch: float, w: float) -> None:
        """A step's mean TPOT net of prompt work, kept to estimate the step of a sequence decoding
        alone (_single_step) where a large enough share of the decoding was alone (p0 >= 0.2)."""
        p_alone = math.exp(-max(0.0, batch))
        if p_alone >= 0.2:
            self._single.append((tpot_net, batch, w * p_alone * p_alone, self.num_steps))

    def _mean_step(self, batch: float) -> float:
        """The mean decode step at a time-average batch, as service_model.predict counts it."""
        a, c, d = self._decode_coeffs()
        single = self._single_step()[0]
        return float(seen_step_s(a + c, c, a + c if single is None else single, max(0.0, batch), d))

    def _single_step(self) -> tuple[float | None, float]:
        """(seconds, sd of log) of one sequence decoding alone; None until estimated. Each kept
        step inverts the model's mean step at its batch against the current line: single =
        step(1) + (TPOT − seen(B)) / p0, kept between a tenth of the curve at one sequence
        and the curve at two (the step grows with the batch); the weighted median of those."""
        a, c, d = self._decode_coeffs()
        key = (self.num_steps, len(self._single), a, c, d)
        if self._single_cache is not None and self._single_cache[0] == key:
            return self._single_cache[1]
        pts = np.zeros((0, 3))
        if a is not None and self._single:
            arr = np.array(self._single)
            y, b = arr[:, 0], arr[:, 1]
            est = a + c + (y - seen_step_s(a + c, c, a + c, b, d)) / np.exp(-b)   # seen_step_s inverted
            two = a + 2.0 * c + d * math.log(2.0)
            pts = np.column_stack([np.log(np.clip(est, 0.1 * (a + c), two)), arr[:, 2], arr[:, 3]])
        if self._single_prior is not None:
            pts = np.vstack([pts, [self._single_prior[0], self._single_prior[1], self.num_steps]])
        result = weighted_median(pts, self.forget, self.num_steps) if len(pts) else (None, 0.0)
        self._single_cache = (key, result)
        return result

    # -- estimates ------------------------------------------------------------------------
    def _interference(self, lam: float, tpot: float) -> float:
        """The part of a request's TPOT that prompt chunks took at this load, as the current model
        predicts it (requests decoding through a prefill busy period see more chunks than the time
        average, so 1 − ρ alone under-corrects); until a model exists, the time average."""
        model, mix = self.model(), self.mix()
        if model is None or mix is None:
            pf = self.prefill_rate()
            p_mean, _ = self.mix_means()
            return tpot * min(0.9, lam * p_mean / pf) if pf else 0.0
        pred = model.predict(lam, mix)
        if not pred.stable:
            return 0.7 * tpot
        multi = pred.output_tokens > 1
        extra = float(np.mean(pred.tpot_s[multi])) - pred.step_s if multi.any() else 0.0
        return min(max(0.0, extra), 0.7 * tpot)

    @staticmethod
    def _add_lin(acc: list, value: float, w: float) -> None:
        acc[0] += w
        acc[1] += w * value
        acc[2] += w * value * value

    def _prompt_m2(self, p_mean: float) -> float:
        """E[P²] of the prompt lengths: from the sidecars' per-request histograms where they
        export them (as mix() draws them), else exponential lengths (TokenMix.from_means: 2·mean²)."""
        prompt_hist, output_hist = self._hist
        if sum(prompt_hist.values()) >= 20 and sum(output_hist.values()) >= 20:
            mix = self.mix()
            if mix is not None:
                return float(np.mean(np.square(mix.prompt_tokens)))
        return 2.0 * p_mean * p_mean

    def arrival_dispersion(self) -> float:
        """The arrivals' index of dispersion at the prompt queue's own time scale, a prompt's mean
        service time (arrivals closer together than that queue behind each other; slower swings
        of the rate are the demand forecast's): 1 (Poisson) while unknown, never under 1."""
        k, _ = self._per_token_k()
        p_mean, _ = self.mix_means()
        return self.clumping.at(k * p_mean if (k and p_mean > 0) else None)

    def mix_means(self) -> tuple[float, float]:
        n, p, o = self._mix
        if n <= 0:
            return 0.0, 0.0
        return p / n, max(1.0, o / n)

    def _decode_line(self) -> RobustLine:
        """Iterations where the engines count them and a handful of steps could use them; TPOT
        otherwise. Iterations read the step at once (TPOT waits for requests to end) but only
        while every replica stays busy: replica-seconds over iterations counts idle time as step
        time, so they are taken from one-replica fleets only (with several, the router leaves some
        idle while the sum looks busy)."""
        return self._decode if len(self._decode.points) >= 5 else self._decode_tpot

    def _decode_coeffs(self) -> tuple[float | None, float, float]:
        """(a, c, d) of the step a + c·b + d·ln b; a is None until there is a fit."""
        fit = self._decode_line().fit(self.num_steps, floor_a=1e-4)
        return (None, 0.0, 0.0) if fit is None else (fit.a, fit.c, fit.d)

    def _decode_band(self) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float]]:
        fit = self._decode_line().fit(self.num_steps, floor_a=1e-4)
        if fit is None:
            return (math.nan, math.nan), (math.nan, math.nan), (math.nan, math.nan)
        return ((max(1e-4, fit.a - _Z90 * fit.se_a), fit.a + _Z90 * fit.se_a),
                (max(0.0, fit.c - _Z90 * fit.se_c), fit.c + _Z90 * fit.se_c),
                (max(0.0, fit.d - _Z90 * fit.se_d), fit.d + _Z90 * fit.se_d))

    @staticmethod
    def _log_mean(acc) -> tuple[float | None, float]:
        w, s, ss = acc
        if w <= 0:
            return None, 0.0
        m = s / w
        sd = math.sqrt(max(0.0, ss / w - m * m))
        return m, sd

    def _per_token_k(self) -> tuple[float | None, float]:
        """(k, sd of log k): seconds a prompt token occupies the prefill queue."""
        pts = list(self._pf)
        if self._pf_prior is not None:
            pts.append((self._pf_prior[0], self._pf_prior[1], self.num_steps))
        return weighted_median(pts, self.forget, self.num_steps) if pts else (None, 0.0)

    def _per_chunk_s(self) -> float:
        a, c, _ = self._decode_coeffs()
        if a is None or not self.step_token_budget:
            return 0.0
        return (a + c) / self.step_token_budget   # a step at batch 1

    def _rate_from_k(self, k: float) -> float:
        # Net of the decode part of the chunks' steps (pro rata, as service_model.predict counts
        # them); where that is lost in the noise (prefill far faster than a step), a tenth of it.
        per_chunk = self._per_chunk_s()
        return 1.0 / max(k - per_chunk, 0.1 * per_chunk, 1e-9)

    def prefill_rate(self) -> float | None:
        k, _ = self._per_token_k()
        return self._rate_from_k(k) if k else None

    def ttft_overhead_s(self) -> float:
        w, s, _ = self._overhead
        return s / w if w > 0 else 0.0

    @property
    def ready(self) -> bool:
        return self._seeded or (self.num_steps >= self.min_steps and self._per_token_k()[0] is not None
                                and self._decode_coeffs()[0] is not None)

    def model(self) -> ServiceModel | None:
        if not self.ready:
            return None
        a, c, d = self._decode_coeffs()
        pf = self.prefill_rate()
        kv_m, _ = self._log_mean(self._kv)
        kv = math.exp(kv_m) if kv_m is not None else (self.prior.kv_capacity_tokens if self.prior else 1e12)
        return ServiceModel(prefill_tokens_per_s=pf, decode_base_s=a, decode_per_seq_s=c, kv_capacity_tokens=kv,
                            max_batch=self.max_batch, step_token_budget=self.step_token_budget or _DEFAULT_BUDGET,
                            ttft_overhead_s=self.ttft_overhead_s(), decode_single_s=self._single_step()[0], decode_log_s=d,
                            arrival_dispersion=self.arrival_dispersion(), wait_scale=self.wait_scale(), name="learned", source=f"learned online over {self.num_steps} steps")

    def planning_model(self, fitted: ServiceModel | None = None) -> ServiceModel | None:
        """The model to plan capacity on: the decode slope at the steep end of its 90 % band, the
        line turned about the mean batch it was fitted on (intercept and slope least correlated
        there), so the steps at the batches seen stay as measured. Capacity extrapolates to the
        SLO's batch; after only small batches (0-4 at half load) the slope is barely known, and
        planning on the mean stated capacity up to 3x too high. As the batches spread, the band
        closes and this becomes the fitted model. `fitted`: self.model(), if the caller has it."""
        m = self.model() if fitted is None else fitted
        fit = self._decode_line().fit(self.num_steps, floor_a=1e-4)
        if m is None or fit is None or not (fit.se_c > 0):
            return m
        x0 = max(1.0, fit.x_mean)
        at_center = fit.a + fit.c * x0
        c_hi = fit.c + _Z90 * fit.se_c
        a_hi = at_center - c_hi * x0
        if a_hi < 1e-4:   # the steepest line through the centre that keeps a positive intercept
            a_hi, c_hi = 1e-4, (at_center - 1e-4) / x0
        return replace(m, decode_base_s=a_hi, decode_per_seq_s=max(fit.c, c_hi), name="learned (planning)")

    def mix(self) -> TokenMix | None:
        """The recent token mix: from the sidecars' per-request token histograms where they export
        them (the shape matters: how long the long prompts are sets the TTFT tail), else
        exponential lengths around the counters' means."""
        p, o = self.mix_means()
        if p <= 0:
            return None
        prompt_hist, output_hist = self._hist
        if sum(prompt_hist.values()) >= 20 and sum(output_hist.values()) >= 20:
            return TokenMix.from_histograms(prompt_hist, output_hist, p, o)
        return TokenMix.from_means(p, o)

    def params(self) -> FittedParams | None:
        m = self.model()
        if m is None:
            return None
        (a_lo, a_hi), (c_lo, c_hi), d_band = self._decode_band()
        k, k_sd = self._per_token_k()
        pf_band = (self._rate_from_k(k * math.exp(_Z90 * k_sd)), self._rate_from_k(k * math.exp(-_Z90 * k_sd)))
        w, s1, s2 = self._overhead
        o_mean = s1 / w if w > 0 else 0.0
        o_sd = math.sqrt(max(0.0, s2 / w - o_mean * o_mean)) if w > 0 else 0.0
        kv_m, kv_sd = self._log_mean(self._kv)
        kv_band = (math.exp(kv_m - _Z90 * kv_sd), math.exp(kv_m + _Z90 * kv_sd)) if kv_m is not None else (math.nan, math.nan)
        p, o = self.mix_means()
        single, single_sd = self._single_step()
        single_band = ((single * math.exp(-_Z90 * single_sd), single * math.exp(_Z90 * single_sd)) if single
                       else (a_lo + c_lo, a_hi + c_hi))
        return FittedParams(m, (a_lo, a_hi), (c_lo, c_hi),
                            pf_band, kv_band, p, o, self.num_steps, (max(0.0, o_mean - _Z90 * o_sd), o_mean + _Z90 * o_sd),
                            single_band, d_band, self.arrival_dispersion(), m.wait_scale, m.wait_scale)


__all__ = ["FittedParams", "OnlineServiceModel"]
