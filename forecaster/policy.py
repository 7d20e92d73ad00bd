"""From fleet samples to a replica count (DESIGN.md, "Forecasting under feedback").

1. Forecast demand (the arrival rate), which the fleet does not influence.
2. Know capacity per replica within the SLO, μ (configured, or learned online: the service
   model, forecaster/service_learn.py), and the rate a backlog drains at, μ_drain (what
   replicas served while a queue waited; forecaster/capacity.py).
3. Predict the queue with a fluid model stepped over the horizon,
   q(t+Δ) = max(0, q(t) + (λ̂(t) − μ_drain·N_ready(t))·Δ), counting replicas still starting.
4. Desired replicas = the fewest whose predicted queue stays at or under the target using the
   forecast's upper bound (its level the forecast's or the last window's mean, whichever has
   forecast such windows better: forecaster/demand.py); never fewer than today's rate and queue
   need, the demand's upper bound, or the floor recurring bursts shorter than the cold start need; scale down only once
   the stabilisation window agrees (seeded, as a new HPA's, with the replicas already there;
   compared with the most replicas the fleet showed in it), never below the demand's upper bound,
   and not at all while the fleet shows it is short now (its backlog growing, or its SLO missed
   beyond chance: forecaster/overload.py). Until a rate is known, the current count.

`target_queue` is for the whole fleet (requests waiting, summed over replicas).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from forecaster.bursts import burst_floor, burst_in_memory
from forecaster.capacity import OnlineCapacity
from forecaster.demand import DemandWindow, cumulative_upper, demand_spread, rate_lower_bound, without_poisson
from forecaster.fleet_sample import FleetSample, delta, step_observation
from forecaster.models import Model, make_model
from forecaster.overload import ShortNow
from forecaster.selection import ModelSelector
from forecaster.series import GaugeSeries, RateSeries
from forecaster.service_learn import OnlineServiceModel


@dataclass
class PolicyConfig:
    step_seconds: float = 15.0
    horizon_seconds: float = 180.0          # = replica cold start
    cold_start_seconds: float = 180.0
    capacity_rps: float | None = None       # per-replica requests/s while SLOs hold; None = learn online
    target_queue: float = 0.0               # requests allowed waiting at the horizon, whole fleet
    min_replicas: int = 1
    max_replicas: int = 100
    scale_down_window_seconds: float = 300.0
    refit_every_seconds: float = 300.0
    fit_timeout_seconds: float = 2.0
    # Time after the horizon in which newly ordered replicas must have drained the queue to target.
    drain_seconds: float = 60.0
    history_seconds: float = 86400.0        # kept per series (a day at 15 s = 5,760 points)
    interval: float = 0.9                   # central prediction interval; upper = its top
    models: tuple[str, ...] = ("level", "holt_winters")  # candidates; level holds naive (alpha 1)
    season_seconds: float | None = 86400.0  # daily season once two days of history exist
    prior_capacity_rps: float = 1.0         # learning online: used until anything is observed
    prior_model: object | None = None       # a service_model.ServiceModel to seed the online fit
    prior_weight: float = 2.0               # how many requests' evidence the prior model counts as
    prior_batches: tuple = ()               # the batches its decode steps were measured at (a bench's)
    slos: tuple | None = None               # SLO classes (service_model.Slo); None = read from the sidecars
    learn_cold_start: bool = False          # take cold_start_seconds from what the source learns
    background_selection: bool = False      # re-select models in a thread (the server); False = reproducible

    def validate(self) -> None:
        for name in ("step_seconds", "horizon_seconds", "refit_every_seconds", "fit_timeout_seconds",
                     "history_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.cold_start_seconds < 0 or self.drain_seconds <= 0 or self.scale_down_window_seconds < 0:
            raise ValueError("cold_start_seconds and scale_down_window_seconds must be >= 0, drain_seconds > 0")
        if self.capacity_rps is not None and self.capacity_rps <= 0:
            raise ValueError(f"capacity_rps must be > 0 requests/s (or None to learn it), got {self.capacity_rps}")
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError(f"need 0 <= min_replicas <= max_replicas and max_replicas >= 1, "
                             f"got {self.min_replicas}..{self.max_replicas}")
        if self.target_queue < 0:
            raise ValueError(f"target_queue must be >= 0, got {self.target_queue}")
        for name in self.models:
            make_model(name)  # raises ValueError naming the choices

    @property
    def horizon_steps(self) -> int:
        return max(1, math.ceil(self.horizon_seconds / self.step_seconds))


@dataclass
class Decision:
    desired_replicas: int
    queue_depth_mean: float     # predicted at horizon for current replicas
    queue_depth_upper: float
    arrival_rate_mean: float    # requests/s at horizon
    arrival_rate_upper: float
    capacity_rps: float
    model_name: str
    # Per SLO class, predicted by the service model at the horizon with the current replicas:
    # {class: (mean, upper)}, mean = the mean at the demand's mean, upper = what the class's
    # objective ratio of requests stay under (its p99 for 0.99) at the demand's upper bound.
    # Empty while the model is not known.
    ttft_s: dict = field(default_factory=dict)
    tpot_s: dict = field(default_factory=dict)
    capacity_source: str = "prior"   # configured | service-model | throughput | prior
    cold_start_s: float = 0.0        # the cold start the decision assumed (configured or learned)
    service: object | None = None    # service_learn.FittedParams when learned
    reasons: tuple = ()              # which terms set desired_replicas
    # The demand window's mean came from this estimate (demand.DemandWindow: "forecast" or
    # "recent", whichever has forecast the windows that have ended better).
    demand_estimate: str = "forecast"


@dataclass
class _History:
    """Fixed-step series of the fleet; one owner for every series the policy reads."""
    step: float
    capacity: int
    rates: dict = field(default_factory=dict)
    gauges: dict = field(default_factory=dict)
    last_sample: FleetSample | None = None

    def __post_init__(self):
        for name in ("arrivals", "input_tokens", "output_tokens", "preemptions", "good"):
            self.rates[name] = RateSeries(self.step, self.capacity)
        for name in ("in_flight", "queue_waiting", "running", "kv_cache_usage", "ready_replicas"):
            self.gauges[name] = GaugeSeries(self.step, self.capacity)

    def add(self, s: FleetSample) -> bool:
        if self.last_sample is not None and s.t <= self.last_sample.t:
            return False  # late or repeated sample
        for name, value in (("arrivals", s.arrivals_total), ("input_tokens", s.input_tokens_total),
                            ("output_tokens", s.output_tokens_total), ("preemptions", s.preemptions_total),
                            ("good", s.good_total)):
            if value is not None:
                self.rates[name].update(s.t, float(value))
        for name in self.gauges:
            self.gauges[name].update(s.t, getattr(s, name))
        self.last_sample = s
        return True


class ForecastPolicy:
    def __init__(self, config: PolicyConfig):
        config.validate()
        self.config = config
        step = config.step_seconds
        self.history = _History(step, max(2, int(config.history_seconds / step)))
        season = round(config.season_seconds / step) if config.season_seconds else None
        candidates: list[Model] = [make_model(name, config.interval, season) for name in config.models]
        self.selector = ModelSelector(candidates, config.horizon_steps, config.fit_timeout_seconds,
                                      reselect_every=max(1, round(config.refit_every_seconds / step)),
                                      background=config.background_selection)
        self.online = OnlineCapacity(prior_rps=config.prior_capacity_rps)
        self.service = OnlineServiceModel(prior=config.prior_model, prior_weight=config.prior_weight,
                                          prior_batches=config.prior_batches)
        self.slos: tuple = tuple(config.slos or ())
        self._recommendations: deque[tuple[float, int, int]] = deque()   # (t, recommended, fleet)
        self._prev_in_flight: tuple[float, float] | None = None
        self._capacity_cache: tuple | None = None
        # No burst in the burst floor's memory: only then is the learned wait scale priced.
        self._calm = False
        self.short = ShortNow((1.0 + config.interval) / 2.0, config.horizon_steps)   # short now (overload.py)
        self.last_observation: StepObservation | None = None
        # Per step, per ready replica: good requests/s where the SLO held (else 0), arrivals/s, and
        # requests in flight at its end. Capacity is at least what a window of them sustained.
        self._demonstrated: deque[tuple[float, float, float]] = deque(maxlen=max(2, int(3600 / step)))
        # The demand's window: the forecast's mean or the last window's, whichever forecasts it better.
        self.demand_window = DemandWindow(level=(1.0 + config.interval) / 2.0)

    # -- inputs ---------------------------------------------------------------------------
    def observe(self, sample: FleetSample) -> None:
        prev = self.history.last_sample
        if not self.history.add(sample):
            return
        arrivals = self.history.rates["arrivals"].last
        if self._prev_in_flight is not None and arrivals is not None:
            t0, q0 = self._prev_in_flight
            dt = sample.t - t0
            if dt > 0 and math.isfinite(sample.in_flight):
                # Requests that left the system = those that came in minus the growth in flight.
                served = arrivals - (sample.in_flight - q0) / dt
                good = self.history.rates["good"].last if sample.good_total is not None else None
                self.online.observe(served, int(sample.ready_replicas), sample.queue_waiting, good)
        if math.isfinite(sample.in_flight):
            self._prev_in_flight = (sample.t, sample.in_flight)
        if sample.slos and not self.config.slos:
            self.slos = tuple(sample.slos)
        if prev is not None:
            obs = step_observation(prev, sample, arrivals)
            self.short.observe(delta(prev.good_total, sample.good_total), delta(prev.ended_total, sample.ended_total),
                               sample.in_flight)
            if obs is not None:
                self.last_observation = obs
                self._calm = self._no_burst()
                self.service.observe(obs, calm=self._calm)
                self._capacity_cache = None
                good = delta(prev.good_total, sample.good_total)
                target = self._target_ratio()
                held = good is not None and obs.ended > 0 and good >= target * obs.ended
                in_flight = sample.in_flight / obs.replicas if math.isfinite(sample.in_flight) else math.inf
                self._demonstrated.append((good / obs.dt / obs.replicas if held else 0.0,
                                           obs.arrival_rps / obs.replicas, in_flight))

    def _slo_capacity(self) -> float | None:
        """Requests/s one replica serves while every SLO class meets its objectives, for the
        current token mix, from the learned service model (None while it is not known); never
        less than what replicas were seen to serve while the SLO held (a model fitted on a few
        minutes can be far off; the fleet's own record is a floor)."""
        if not self.slos:
            return None
        if self._capacity_cache is None:
            model, mix = self.service.model(), self.service.mix()
            if model is None or mix is None:
                return None
            if not self._calm and model.wait_scale != 1.0:
                model = replace(model, wait_scale=1.0)
            # Planned on the steep end of the fitted step's slope (OnlineServiceModel.planning_model);
            # the latencies it forecasts come from the fitted model itself.
            planning = self.service.planning_model(model)
            cap = planning.slo_capacity_rps(mix, self.slos)
            # Turned about the mean batch, the planning line runs under the fitted one below it;
            # where capacity is decided at such a batch, planning would state more than the fitted
            # model. It never does: the fitted model is checked at the planned rate (two
            # predictions: idle and at that rate), and bisected below it only where it misses.
            if planning is not model and cap > 0 and not model.meets_slo(cap, mix, self.slos):
                cap = model.slo_capacity_rps(mix, self.slos, hi=cap)
            self._capacity_cache = (model, mix, max(cap, self.demonstrated_rps))
        return self._capacity_cache[2]

    @property
    def demonstrated_rps(self) -> float:
        """The highest rate one replica sustained with the SLO holding, over the last hour: the
        mean over the drain time (so a lucky step does not count) of the good requests it served,
        and no more than the requests that arrived, in windows that left no more in flight than
        they found. A window in which load builds up (the batch growing past what the replica
        sustains, the requests ending in it still judged good because they began before) serves
        a rate it cannot keep: in a simulated step to twice a replica's capacity such windows
        read 1.5x the capacity."""
        if not self._demonstrated:
            return 0.0
        good, arrived, in_flight = (np.asarray(x) for x in zip(*self._demonstrated))
        w = max(1, math.ceil(self.config.drain_seconds / self.config.step_seconds))
        if len(good) < w + 1:
            return 0.0
        kernel = np.ones(w) / w
        # Windows from the second step on, each against what the step before it left in flight.
        served = np.convolve(good, kernel, mode="valid")[1:]
        came = np.convolve(arrived, kernel, mode="valid")[1:]
        steady = in_flight[w:] <= in_flight[:-w]
        rates = np.minimum(served, came)[steady]
        return float(rates.max()) if len(rates) else 0.0

    @property
    def capacity_source(self) -> str:
        if self.config.capacity_rps is not None:
            return "configured"
        if self._slo_capacity():
            return "service-model"
        return "throughput" if self.online.learned_rps is not None else "prior"

    @property
    def capacity_rps(self) -> float:
        if self.config.capacity_rps is not None:
            return self.config.capacity_rps
        learned = self._slo_capacity()
        if learned:
            return learned
        return self.online.capacity_rps

    def learned_cold_start(self, seconds: float | None) -> None:
        """A cold start the fleet showed (pods not ready until ready), used unless configured."""
        if self.config.learn_cold_start and seconds is not None and math.isfinite(seconds) and seconds > 0:
            self.config.cold_start_seconds = float(seconds)

    # -- the decision ---------------------------------------------------------------------
    @property
    def drain_rps(self) -> float:
        """Requests/s one replica takes off a backlog: what replicas served per second while a
        queue waited (busy, SLOs or not), never less than the SLO capacity. A queue's requests
        are judged already; clearing it is a matter of throughput, while new demand is planned at
        the rate SLOs hold. A model fitted in a burst's aftermath can put the SLO capacity far
        below throughput, and then draining at it would ask for many times the replicas needed."""
        mu = self.capacity_rps
        seen = self.online.drain_rps
        return max(mu, seen) if seen is not None and math.isfinite(seen) else mu

    def fluid_queue(self, q0: float, lam: np.ndarray, ready_at: np.ndarray) -> np.ndarray:
        """Queue after each step: q ← max(0, q + (λ_k − μ·N_k)·Δ), μ the drain rate."""
        mu, dt = self.drain_rps, self.config.step_seconds
        out = np.empty(len(lam))
        q = q0
        for k in range(len(lam)):
            q = max(0.0, q + (lam[k] - mu * ready_at[k]) * dt)
            out[k] = q
        return out

    def _ready_profile(self, ready: int, starting: int, added: int, steps: int) -> np.ndarray:
        """Replicas serving during each step. Replicas already starting are assumed halfway
        through their cold start (we do not know when each began); ones ordered now need all of it."""
        dt, cold = self.config.step_seconds, self.config.cold_start_seconds
        t_end = np.arange(1, steps + 1) * dt
        return ready + starting * (t_end > cold / 2) + added * (t_end > cold)

    def _latency_forecast(self, rates: tuple[float, float], replicas: int) -> tuple[dict, dict]:
        """Per class, (mean TTFT at the mean demand, TTFT at the class's objective ratio at the
        upper demand), and the same for TPOT, with `replicas` sharing the load."""
        if self._capacity_cache is None or not self.slos:
            return {}, {}
        model, mix, _ = self._capacity_cache
        at_mean, at_upper = (model.predict(r / max(replicas, 1), mix) for r in rates)

        def mean(values, pred):
            return float(values.mean()) if pred.stable else math.inf

        multi = at_mean.output_tokens > 1
        ttft = {s.name: (mean(at_mean.ttft_s, at_mean), at_upper.ttft_quantile(s.ratio)) for s in self.slos}
        tpot = {s.name: (mean(at_mean.tpot_s[multi], at_mean) if multi.any() else 0.0,
                         at_upper.tpot_quantile(s.ratio)) for s in self.slos}
        return ttft, tpot

    def decide(self, now: float, starting_replicas: int = 0) -> Decision:
        cfg = self.config
        last = self.history.last_sample
        mu = self.capacity_rps
        source = self.capacity_source
        # A prior service model was given and the SLO is known, but no request has ended yet, so
        # the token mix the model needs is not known, and the capacity would be the 1 req/s
        # placeholder: in the demo that asked for 2 replicas 2 s into a half-load phase. Hold,
        # for at most a horizon of steps (a fleet whose requests never end still gets planned).
        # (Source "prior" with the SLO known and a seeded model: only the mix is missing.)
        steps_seen = len(self.history.rates["arrivals"].values())
        waiting_for_mix = (cfg.prior_model is not None and bool(self.slos) and source == "prior"
                           and steps_seen <= cfg.horizon_steps)
        if last is None or steps_seen == 0 or waiting_for_mix:
            # Nothing to go on yet: keep what is there (publishing the minimum would have the HPA
            # take the fleet down to it the moment a forecaster starts or restarts).
            held = cfg.min_replicas if last is None else \
                min(cfg.max_replicas, max(cfg.min_replicas, int(last.ready_replicas) + max(0, int(starting_replicas))))
            return Decision(held, 0.0, 0.0, 0.0, 0.0, mu, "none", reasons=("hold",))
        arrivals = self.history.rates["arrivals"]
        y = arrivals.values()
        last_index = arrivals.series.last_index
        fc = self.selector.forecast(y, end_index=last_index)
        H = cfg.horizon_steps
        ready = max(0, int(last.ready_replicas))
        starting = max(0, int(starting_replicas))
        q0 = max(0.0, float(last.queue_waiting)) if math.isfinite(last.queue_waiting) else 0.0

        # Check point: when replicas ordered now are serving, plus the drain time.
        check_steps = max(H, math.ceil(cfg.cold_start_seconds / cfg.step_seconds)) + \
            math.ceil(cfg.drain_seconds / cfg.step_seconds)
        mean_ext = np.concatenate([fc.mean, np.full(max(0, check_steps - H), fc.mean[-1])])[:check_steps]
        upper_ext = np.concatenate([fc.upper, np.full(max(0, check_steps - H), fc.upper[-1])])[:check_steps]
        # The demand's window: the mean rate over the last `drain_seconds` of the check (a queue
        # drains within that, so shorter bursts need no replica of their own); with a horizon
        # shorter than the drain time, the forecast is held flat past the horizon. Its mean comes
        # from whichever estimate has forecast such windows better (DemandWindow; this
        # forecast joins them), its spread from the per-step errors treated as independent, as in
        # cumulative_upper, and never under a Poisson count's.
        w = min(check_steps, max(1, math.ceil(cfg.drain_seconds / cfg.step_seconds)))
        window = self.demand_window
        window.observe(last_index, y)
        forecast_mean, recent_mean = float(np.mean(mean_ext[-w:])), float(np.mean(y[-w:]))
        if len(y) >= w:
            window.record(last_index, last_index + check_steps - w + 1, last_index + check_steps,
                          {"forecast": forecast_mean, "recent": recent_mean})
        if window.chosen == "recent":
            # The window's level from what was observed: the forecast's path shifted onto it.
            shift = recent_mean - forecast_mean
            mean_ext, upper_ext = np.maximum(0.0, mean_ext + shift), np.maximum(0.0, upper_ext + shift)
        window_mean = float(np.mean(mean_ext[-w:]))
        # The Poisson part: taken out at the lower of the two rates where the model prices it (the
        # smaller share), a floor at the higher where nothing does.
        priced = source == "service-model"
        poisson = window.poisson_spread((min if priced else max)(window_mean, recent_mean), w * cfg.step_seconds)
        spread = demand_spread(upper_ext[-w:] - mean_ext[-w:], poisson, priced)
        current = self._ready_profile(ready, starting, 0, H)
        q_mean = self.fluid_queue(q0, mean_ext[:H], current)[-1]
        q_upper = self.fluid_queue(q0, cumulative_upper(mean_ext[:H], upper_ext[:H]), current)[-1]
        # The queue term's bound on arrivals: with the service model's capacity, which prices the
        # queueing of Poisson arrivals at the rate, each step's bound net of its Poisson part, as
        # the demand term's (demand_spread).
        step_upper = upper_ext if not priced else \
            mean_ext + without_poisson(upper_ext - mean_ext, window.poisson_spread(mean_ext, cfg.step_seconds))
        lam_upper = cumulative_upper(mean_ext, step_upper)
        fluid_n = cfg.max_replicas
        for n in range(max(cfg.min_replicas, 0), cfg.max_replicas + 1):
            profile = self._ready_profile(min(ready, n), min(starting, max(0, n - ready)),
                                          max(0, n - ready - starting), check_steps)
            if self.fluid_queue(q0, lam_upper, profile)[-1] <= cfg.target_queue + 1e-9:
                fluid_n = n
                break
        # Never fewer than today's rate plus draining today's queue needs, nor the demand's upper bound.
        # Today's rate: over the last two steps, its Poisson lower bound at the level of the
        # forecast's upper bound ((1 + interval) / 2, 95 %), so a few requests more than usual at
        # a low rate is not read as a step change (at half a replica's capacity and 3 requests
        # expected in the two steps, about one false alarm in 1,260 decisions), while a real one
        # (load doubling past capacity) shows within two steps.
        rate_now = rate_lower_bound(y[-2:], cfg.step_seconds, (1.0 + cfg.interval) / 2.0)
        need_now = math.ceil(rate_now / mu + max(0.0, q0 - cfg.target_queue) / cfg.drain_seconds / self.drain_rps
                             - 1e-9)
        # The demand's upper bound over its window.
        demand_upper = window_mean + spread
        demand_floor = math.ceil(demand_upper / mu - 1e-9)
        burst = self._burst_floor(y, mu)
        terms = {"queue": fluid_n, "now": need_now, "demand": demand_floor, "burst": burst}
        raw = min(cfg.max_replicas, max(cfg.min_replicas, *terms.values()))
        desired = self._stabilise(now, raw, ready + starting, max(demand_floor, burst))
        reasons = decision_reasons(terms, raw, cfg.max_replicas)
        if self.short.last is not None and desired < self.short.last:
            short = self.short.reasons(self.history.gauges["in_flight"].values(), y, cfg.step_seconds,
                                       self._target_ratio(), self._feasible())
            if short:
                desired, reasons = self.short.last, reasons + short
        self.short.published(desired)
        self._slo_capacity()   # the latency forecast needs the fitted model, configured capacity or not
        ttft, tpot = self._latency_forecast((float(fc.mean[-1]), float(fc.upper[-1])), max(1, ready + starting))
        return Decision(int(desired), float(q_mean), float(q_upper), float(fc.mean[-1]), float(fc.upper[-1]),
                        float(mu), fc.model_name, ttft_s=ttft, tpot_s=tpot, capacity_source=source,
                        cold_start_s=cfg.cold_start_seconds,
                        service=self._params(), reasons=reasons, demand_estimate=window.chosen)

    def _feasible(self) -> float:
        """The share of requests an idle replica serves in time, from the model (all while unknown)."""
        known = self.slos and self._slo_capacity() and self._capacity_cache
        return min(known[0].feasible_shares(known[1], self.slos).values()) if known else 1.0

    def _burst_floor(self, y: np.ndarray, mu: float) -> int:
        """Replicas for recurring bursts shorter than the cold start (forecaster/bursts.py)."""
        cfg = self.config
        return burst_floor(y, mu, cfg.step_seconds, cfg.cold_start_seconds, self._burst_window_steps(),
                           self._target_ratio())

    def _params(self):
        """The learned parameters, with the wait scale planning uses now."""
        params = self.service.params()
        if params is not None and not self._calm:
            params = replace(params, wait_scale_planned=1.0)
        return params

    def _no_burst(self) -> bool:
        """No window of the burst floor's memory stands out as a burst (forecaster/bursts.py)."""
        cfg = self.config
        return not burst_in_memory(self.history.rates["arrivals"].values(), cfg.step_seconds, cfg.cold_start_seconds,
                                   self._burst_window_steps(), self._target_ratio())

    def _target_ratio(self) -> float:
        """The strictest objective ratio among the SLO classes (0.99 while none is known)."""
        return max((x.ratio for x in self.slos), default=0.99)

    def _burst_window_steps(self) -> int:
        ttft = min((x.ttft_s for x in self.slos), default=0.0)
        return max(1, math.ceil(ttft / self.config.step_seconds - 1e-9))

    def _stabilise(self, now: float, raw: int, current: int, demand_floor: int) -> int:
        """Up at once; down only to the highest recommendation of the last window (as HPA does).
        The need is compared with the most replicas the fleet showed (`current`, ready + starting,
        at each step) within the window: the HPA reads desired replicas late (the metric delay),
        so a count published and shown may vanish from the fleet for a step while the HPA acts on
        an older value. Read from the last step alone, a need equal to what was left withdrew it,
        the HPA removed the starting pod, the next step ordered it again (on the ServeGen slice,
        6 -> 7 -> 6 every 15 s: 57 scale events, 19 with this rule)."""
        window = self.config.scale_down_window_seconds
        if not self._recommendations:
            # As a new HPA does: the window starts full of the replicas already there, so the
            # first minutes, while little is known, do not take away capacity someone sized.
            self._recommendations.append((now, current, current))
        self._recommendations.append((now, raw, current))
        while self._recommendations and self._recommendations[0][0] < now - window:
            self._recommendations.popleft()
        shown = max(c for _, _, c in self._recommendations)
        if raw >= shown:
            return raw
        held = max(r for _, r, _ in self._recommendations)
        floor = max(raw, min(demand_floor, self.config.max_replicas))
        return max(floor, min(shown, held))

    def close(self) -> None:
        self.selector.close()


def decision_reasons(terms: dict[str, int], raw: int, max_replicas: int) -> tuple[str, ...]:
    """Which terms set desired replicas `raw`: those equal to it; where the replica bounds did,
    the terms beyond the maximum and "max" (a log line read "min" at 100 replicas), else "min"."""
    equal = tuple(k for k, v in terms.items() if v == raw)
    if equal:
        return equal
    if raw == max_replicas:
        return tuple(k for k, v in terms.items() if v > raw) + ("max",)
    return ("min",)


__all__ = ["FleetSample", "PolicyConfig", "Decision", "ForecastPolicy", "decision_reasons"]
