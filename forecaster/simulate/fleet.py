"""A fleet of replicas serving a per-request trace, advanced in fixed ticks.

Each replica is one engine with continuous batching and chunked prefill, as vLLM V1 schedules:
every engine step carries one token for each decoding sequence plus up to `step_token_budget`
prompt tokens, so a step with a prefill chunk costs step(d) + chunk / prefill_rate. Within a
tick the replica first works through its prefill backlog (FIFO) in such mixed steps, then runs
pure decode steps; first-token and finish times are placed inside the tick from that timeline.
A request is *waiting* (vLLM's num_requests_waiting) until its first prompt chunk is scheduled,
which happens only when the tick still has prefill budget, a batch slot and KV room for the
request's prompt + output (reserved up front, so there are no preemptions).

Routing: least outstanding requests among ready replicas (a load-aware gateway), or a replica drawn
at random (`router="random"`: a Kubernetes Service), at the first tick start at or after the
request's arrival (so scheduling is late by under one tick, never early). Replicas start cold
(counted as cost, not serving) and drain when removed (finish everything they hold, take nothing
new). A request whose prompt + output can never fit in one replica's KV cache is dropped.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from forecaster.fleet_sample import FleetSample
from forecaster.prompt_queue import ARRIVAL_WINDOWS_S
from forecaster.service_model import TOKEN_BUCKETS
from forecaster.simulate.profiles import ServiceProfile
from forecaster.simulate.traces import RequestTrace


ROUTERS = ("least-outstanding", "random")   # the first is the default


def servable_alone(profile: ServiceProfile, trace: RequestTrace, tick_s: float = 0.1) -> np.ndarray:
    """Per request: whether it meets the SLO on an idle replica of its own, as RequestFleet serves
    it: routed at the first tick start at or after its arrival, its whole prompt prefilled at the
    prefill rate (no decode shares the steps), decoded alone at the one-sequence step. A request
    that fails even so (a prompt longer than the TTFT objective's worth of prefill) is no capacity
    problem: no number of replicas serves it in time. A request dropped for KV room fails too."""
    arrival = np.asarray(trace.arrival_s, dtype=float)
    prompt = np.asarray(trace.prompt_tokens, dtype=float)
    output = np.maximum(1.0, np.asarray(trace.output_tokens, dtype=float))
    ttft = np.ceil(arrival / tick_s - 1e-9) * tick_s - arrival + prompt / profile.prefill_tokens_per_s
    tpot = np.where(output > 1, profile.step_s(1.0), 0.0)
    fits = prompt + output <= profile.kv_capacity_tokens
    return fits & (ttft <= profile.slo.ttft_s) & (tpot <= profile.slo.tpot_s)


@dataclass
class Replica:
    id: int
    created_s: float
    ready_s: float
    draining: bool = False
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)  # started requests, in start order
    kv_reserved: float = 0.0
    busy_s: float = 0.0
    # Per arrival window (ARRIVAL_WINDOWS_S): the current window's index and the requests routed
    # to it in that window (its sidecar's arrival-burstiness counters).
    arrival_window: list = field(default_factory=lambda: [-1] * len(ARRIVAL_WINDOWS_S))
    arrival_count: list = field(default_factory=lambda: [0] * len(ARRIVAL_WINDOWS_S))

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)


@dataclass(frozen=True)
class FleetView:
    """What the fleet's metrics say at one instant (what /metrics and the sidecars would show)."""

    t: float
    ready: int              # serving and taking new requests
    starting: int           # created, still in cold start
    draining: int           # removed, finishing what they hold
    waiting: float          # not yet started, summed (router + engines)
    running: float
    kv_usage: float         # mean over ready replicas, 0-1
    per_replica_ids: tuple[int, ...]        # ready replicas only, in the same order as below
    per_replica_waiting: tuple[float, ...]
    per_replica_kv: tuple[float, ...]
    busy_s_total: float     # cumulative seconds replicas spent computing
    serving_s_total: float  # cumulative replica-seconds of ready + draining replicas
    arrivals_total: float
    input_tokens_total: float
    output_tokens_total: float
    good_total: float
    finished_total: float
    dropped_total: float
    # Sums of the finished requests' TTFT and TPOT (what the sidecars' histograms export).
    ttft_sum: float = 0.0
    tpot_sum: float = 0.0
    tpot_count: float = 0.0
    decode_batch_sum: float = 0.0     # Σ over those TPOTs' requests of the mean batch they decoded in
    decode_batch_count: float = 0.0
    engine_steps_total: float = 0.0   # decode iterations, summed over replicas
    queue_sum: float = 0.0            # engine queue and prefill time of requests past their first token
    prefill_sum: float = 0.0
    prefill_count: float = 0.0
    input_token_hist: dict | None = None    # {le: cumulative finished requests}, as the sidecars export
    output_token_hist: dict | None = None
    # Tokens of the finished requests, counted when each ends, as the sidecars count them
    # (goodput_input_tokens_total / goodput_output_tokens_total, from usage). input_tokens_total
    # counts prompts as they arrive and output_tokens_total tokens as they are generated.
    ended_input_tokens_total: float = 0.0
    ended_output_tokens_total: float = 0.0
    # {window seconds: Σ over each replica's windows of (requests routed to it in that window)²},
    # as the sidecars export it (goodput_requests_arrived_squared_total).
    arrivals_squared_total: dict | None = None

    @property
    def in_flight(self) -> float:
        return self.waiting + self.running

    def sample(self, slos: tuple | None) -> FleetSample:
        """What the forecaster reads of this fleet, as the sidecars export it: tokens counted when
        each request ends (the mix's means divide by those), one sidecar per ready replica."""
        return FleetSample(
            t=self.t, arrivals_total=self.arrivals_total, input_tokens_total=self.ended_input_tokens_total,
            output_tokens_total=self.ended_output_tokens_total, in_flight=self.in_flight, queue_waiting=self.waiting,
            running=self.running, kv_cache_usage=self.kv_usage, preemptions_total=0.0, ready_replicas=self.ready,
            good_total=self.good_total, ended_total=self.finished_total, ttft_sum_total=self.ttft_sum,
            ttft_count_total=self.finished_total, tpot_sum_total=self.tpot_sum, tpot_count_total=self.tpot_count,
            decode_batch_total=self.decode_batch_sum, decode_batch_count_total=self.decode_batch_count,
            generation_tokens_total=self.output_tokens_total, engine_steps_total=self.engine_steps_total,
            prefill_sum_total=self.prefill_sum, prefill_count_total=self.prefill_count, queue_sum_total=self.queue_sum,
            queue_count_total=self.prefill_count, input_token_hist_total=self.input_token_hist,
            output_token_hist_total=self.output_token_hist, arrivals_squared_total=self.arrivals_squared_total,
            slos=slos)

    @property
    def spec_replicas(self) -> int:
        return self.ready + self.starting


def _cumulative(counts: list[int]) -> dict:
    out, total = {}, 0
    for bound, c in zip(TOKEN_BUCKETS, counts):
        total += c
        out[bound] = float(total)
    return out


class RequestFleet:
    """Owns replicas and every request's progress; set_replicas() is the only control input."""

    def __init__(self, profile: ServiceProfile, trace: RequestTrace, initial_replicas: int,
                 cold_start_s: float, tick_s: float = 0.1, router: str = ROUTERS[0], seed: int = 0):
        if tick_s <= 0 or cold_start_s < 0 or initial_replicas < 0:
            raise ValueError("tick_s must be > 0, cold_start_s >= 0 and initial_replicas >= 0")
        if router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {router!r}")
        self.router = router
        self._rng = np.random.default_rng(seed)
        self.profile, self.cold_start_s, self.tick_s = profile, cold_start_s, tick_s
        self.arrival = np.asarray(trace.arrival_s, dtype=float)
        self.prompt = np.asarray(trace.prompt_tokens, dtype=float)
        self.output = np.maximum(1.0, np.asarray(trace.output_tokens, dtype=float))
        n = len(self.arrival)
        # NOTE: per-request state lives in Python lists: a replica holds a handful of requests, and
        # scalar Python on a few items is several times faster than numpy calls on tiny arrays.
        self._arr = self.arrival.tolist()
        self._prompt = self.prompt.tolist()
        self._out = self.output.tolist()
        self._left = list(self._prompt)
        self._dec = [0.0] * n
        self._batch_area = [0.0] * n   # ∫ (requests decoding on its replica) dt over its decode
        self._t_first = [math.nan] * n
        self._t_routed = [math.nan] * n
        self._t_sched = [math.nan] * n
        self._t_done = [math.nan] * n
        self._good = [False] * n
        self._dropped = [False] * n
        self.next_index = 0
        self.router_queue: deque[int] = deque()
        self.replicas: list[Replica] = []
        self.removed: list[Replica] = []
        self.replica_s = 0.0
        self._busy_total = 0.0
        self._serving_total = 0.0
        self._output_total = 0.0
        self._num_ids = 0
        self._input_total = 0.0
        self._ended_input_total = 0.0
        self._ended_output_total = 0.0
        self._good_total = 0
        self._finished_total = 0
        self._dropped_total = 0
        self._ttft_sum = 0.0
        self._queue_sum = 0.0      # routed -> first chunk scheduled (vLLM's request_queue_time)
        self._prefill_sum = 0.0    # first chunk scheduled -> first token (request_prefill_time)
        self._prefill_count = 0
        self._steps_total = 0.0
        # What the sidecars' per-request token histograms would hold (bucket counts, not cumulative).
        self._in_hist = [0] * len(TOKEN_BUCKETS)
        self._out_hist = [0] * len(TOKEN_BUCKETS)
        self._tpot_sum = 0.0
        self._tpot_count = 0
        # The decode batch each TPOT was measured at, as the sidecars export it (sum, count).
        self._batch_sum = 0.0
        self._batch_count = 0
        self._arrivals_sq_closed = [0.0] * len(ARRIVAL_WINDOWS_S)   # squares of the replicas' ended windows
        for _ in range(initial_replicas):
            self._add_replica(created_s=-cold_start_s, ready_s=0.0)

    # -- control ----------------------------------------------------------------------------
    def _add_replica(self, created_s: float, ready_s: float) -> None:
        self.replicas.append(Replica(self._num_ids, created_s, ready_s))
        self._num_ids += 1

    def spec_replicas(self) -> int:
        """The deployment's replica count: every replica not draining (ready or starting)."""
        return sum(1 for r in self.replicas if not r.draining)

    def set_replicas(self, n: int, now: float) -> None:
        """Scale the deployment to n (ready + starting). Not-ready pods go first, then the newest."""
        live = [r for r in self.replicas if not r.draining]
        if n > len(live):
            for _ in range(n - len(live)):
                self._add_replica(now, now + self.cold_start_s)
            return
        # Sort: starting ones (ready_s > now) first, newest first; then ready ones, newest first.
        victims = sorted(live, key=lambda r: (0 if r.ready_s > now else 1, -r.ready_s))[: len(live) - n]
        for r in victims:
            if r.ready_s > now:
                self.replicas.remove(r)
                self.removed.append(r)
            else:
                r.draining = True

    # -- time -------------------------------------------------------------------------------
    def step(self, now: float) -> None:
        """Advance the fleet over [now, now + tick_s)."""
        dt = self.tick_s
        self._route(now)
        for r in list(self.replicas):
            if r.ready_s > now:
                continue
            self._serving_total += dt
            if r.waiting or r.running:
                r.busy_s += self._serve(r, now, dt)
            elif r.draining:
                self.replicas.remove(r)
                self.removed.append(r)
                for j, n in enumerate(r.arrival_count):
                    self._arrivals_sq_closed[j] += n * n
                r.arrival_count = [0] * len(ARRIVAL_WINDOWS_S)
        self.replica_s += len(self.replicas) * dt

    def _route(self, now: float) -> None:
        end = int(np.searchsorted(self.arrival, now, side="right"))
        kv_cap = self.profile.kv_capacity_tokens
        for i in range(self.next_index, end):
            self._input_total += self._prompt[i]
            if self._prompt[i] + self._out[i] > kv_cap:
                self._dropped[i] = True
                self._dropped_total += 1
            else:
                self.router_queue.append(i)
        self.next_index = end
        targets = [r for r in self.replicas if not r.draining and r.ready_s <= now]
        if not targets or not self.router_queue:
            return
        load = np.array([r.outstanding for r in targets])
        pick_random = self.router == "random"
        while self.router_queue:
            k = int(self._rng.integers(len(targets))) if pick_random else int(np.argmin(load))
            i = self.router_queue.popleft()
            r = targets[k]
            r.waiting.append(i)
            # Its sidecar counts it when it arrives: the router here forwards at tick starts, a
            # real one at once, and the window counts should not carry the ticks' grain.
            for j, width in enumerate(ARRIVAL_WINDOWS_S):
                window = int(self._arr[i] // width)
                if r.arrival_window[j] != window:
                    self._arrivals_sq_closed[j] += r.arrival_count[j] ** 2
                    r.arrival_window[j], r.arrival_count[j] = window, 0
                r.arrival_count[j] += 1
            self._t_routed[i] = now
            load[k] += 1

    def _serve(self, r: Replica, now: float, dt: float) -> float:
        """One tick of one replica; returns the seconds it computed."""
        p = self.profile
        rate, budget = p.prefill_tokens_per_s, float(p.step_token_budget)
        left, dec, out, prompt = self._left, self._dec, self._out, self._prompt
        running = r.running
        d = sum(1 for i in running if left[i] <= 0)
        backlog = sum(left[i] for i in running if left[i] > 0)
        s_mix = (p.step_s(d) if d else 0.0) + budget / rate  # a step carrying a full prompt chunk
        tick_prefill = budget * dt / s_mix                    # prompt tokens this tick can take
        # Schedule waiting requests while this tick has prompt budget, a slot and KV room.
        while r.waiting and backlog < tick_prefill and len(running) < p.max_batch:
            i = r.waiting[0]
            need = prompt[i] + out[i]
            if r.kv_reserved + need > p.kv_capacity_tokens:
                break
            r.waiting.popleft()
            running.append(i)
            self._t_sched[i] = now
            self._queue_sum += now - self._t_routed[i]
            r.kv_reserved += need
            backlog += left[i]
        rate_eff = budget / s_mix
        t_prefill = min(dt, backlog / rate_eff)
        done_tokens = rate_eff * t_prefill
        # Decoding requests start the tick at step 0; prefill goes FIFO, and a request whose prompt
        # completes inside the tick gets its first token then and decodes from there.
        timeline = [(i, 0.0) for i in running if left[i] <= 0]
        cum = 0.0
        for i in running:
            li = left[i]
            if li <= 0:
                continue
            if cum + li <= done_tokens + 1e-9:
                cum += li
                first_at = cum / rate_eff
                self._t_first[i] = now + first_at
                self._prefill_sum += now + first_at - self._t_sched[i]
                self._prefill_count += 1
                dec[i] = 1.0
                left[i] = 0.0
                self._output_total += 1.0
                timeline.append((i, first_at))
            else:
                left[i] = li - max(0.0, done_tokens - cum)
                break
        # Decode timeline: mixed steps (s_mix each) until t_prefill, pure steps after.
        n_mix = t_prefill / s_mix
        s_pure = p.step_s(len(timeline))
        steps_total = n_mix + (dt - t_prefill) / s_pure
        finished = []
        still_running = False
        last_off = 0.0
        spans = []           # (request, seconds it decoded in this tick)
        for i, start in timeline:
            before = start / s_mix if start <= t_prefill else n_mix + (start - t_prefill) / s_pure
            remaining = out[i] - dec[i]
            avail = steps_total - before
            if remaining <= avail + 1e-9:
                k = before + remaining  # step index (from tick start) of the last token
                off = k * s_mix if k <= n_mix else t_prefill + (k - n_mix) * s_pure
                self._t_done[i] = now + off
                last_off = max(last_off, off)
                finished.append(i)
                spans.append((i, off - start))
                dec[i] += remaining
                self._output_total += remaining
            else:
                gained = max(avail, 0.0)
                dec[i] += gained
                self._output_total += gained
                still_running = True
                spans.append((i, dt - start))
        busy = dt if still_running else max(t_prefill, last_off)
        if spans:
            # Each request's share of the tick times the mean count decoding from the first start
            # (the timeline's first: those decoding at the tick's start, else the earliest prompt
            # done) to the last end (a tick is a fraction of a second: finer timing is not the point).
            span = (dt if still_running else last_off) - timeline[0][1]
            mean = sum(s for _, s in spans) / span if span > 0 else float(len(spans))
            area = self._batch_area
            for i, s in spans:
                area[i] += s * mean
        # Engine iterations (what vllm:iteration_tokens_total counts): mixed steps, then pure ones.
        self._steps_total += n_mix + max(0.0, busy - t_prefill) / s_pure
        if finished:
            slo = p.slo
            for i in finished:
                ttft = self._t_first[i] - self._arr[i]
                tpot = (self._t_done[i] - self._t_first[i]) / (out[i] - 1) if out[i] > 1 else 0.0
                good = ttft <= slo.ttft_s and tpot <= slo.tpot_s
                self._ttft_sum += ttft
                self._ended_input_total += prompt[i]
                self._ended_output_total += out[i]
                self._in_hist[bisect_left(TOKEN_BUCKETS, prompt[i])] += 1
                self._out_hist[bisect_left(TOKEN_BUCKETS, out[i])] += 1
                if out[i] > 1:
                    self._tpot_sum += tpot
                    self._tpot_count += 1
                    span = self._t_done[i] - self._t_first[i]
                    if span > 0:
                        self._batch_sum += self._batch_area[i] / span
                        self._batch_count += 1
                self._good[i] = good
                self._good_total += good
                r.kv_reserved -= prompt[i] + out[i]
            self._finished_total += len(finished)
            gone = set(finished)
            r.running = [i for i in running if i not in gone]
        self._busy_total += busy
        return busy

    # -- per-request results as arrays (for scoring; not for the hot loop) --------------------
    @property
    def prefill_left(self) -> np.ndarray:
        return np.array(self._left)

    @property
    def decoded(self) -> np.ndarray:
        return np.array(self._dec)

    @property
    def t_first(self) -> np.ndarray:
        return np.array(self._t_first)

    @property
    def t_done(self) -> np.ndarray:
        return np.array(self._t_done)

    @property
    def good(self) -> np.ndarray:
        return np.array(self._good, dtype=bool)

    @property
    def dropped(self) -> np.ndarray:
        return np.array(self._dropped, dtype=bool)

    # -- observation ------------------------------------------------------------------------
    def view(self, now: float) -> FleetView:
        ready = [r for r in self.replicas if not r.draining and r.ready_s <= now]
        starting = sum(1 for r in self.replicas if r.ready_s > now)
        draining = sum(1 for r in self.replicas if r.draining)
        cap = self.profile.kv_capacity_tokens
        kv = []
        for r in ready:
            used = sum(self._prompt[i] - self._left[i] + self._dec[i] for i in r.running)
            kv.append(used / cap)
        waiting = len(self.router_queue) + sum(len(r.waiting) for r in self.replicas)
        running = sum(len(r.running) for r in self.replicas)
        return FleetView(
            t=now, ready=len(ready), starting=starting, draining=draining,
            waiting=float(waiting), running=float(running),
            kv_usage=float(np.mean(kv)) if kv else 0.0,
            per_replica_ids=tuple(r.id for r in ready),
            per_replica_waiting=tuple(float(len(r.waiting)) for r in ready),
            per_replica_kv=tuple(kv),
            busy_s_total=self._busy_total, serving_s_total=self._serving_total,
            arrivals_total=float(self.next_index),
            input_tokens_total=self._input_total,
            output_tokens_total=self._output_total,
            good_total=float(self._good_total),
            finished_total=float(self._finished_total),
            dropped_total=float(self._dropped_total),
            ttft_sum=self._ttft_sum, tpot_sum=self._tpot_sum, tpot_count=float(self._tpot_count),
            decode_batch_sum=self._batch_sum, decode_batch_count=float(self._batch_count),
            engine_steps_total=self._steps_total, queue_sum=self._queue_sum, prefill_sum=self._prefill_sum,
            prefill_count=float(self._prefill_count),
            input_token_hist=_cumulative(self._in_hist), output_token_hist=_cumulative(self._out_hist),
            ended_input_tokens_total=self._ended_input_total, ended_output_tokens_total=self._ended_output_total,
            arrivals_squared_total={w: self._arrivals_sq_closed[j] + float(sum(r.arrival_count[j] ** 2 for r in self.replicas))
                                    for j, w in enumerate(ARRIVAL_WINDOWS_S)},
        )

    @property
    def idle(self) -> bool:
        """Every request has arrived and none is held anywhere."""
        return self.next_index >= len(self.arrival) and not self.router_queue and \
            all(not r.waiting and not r.running for r in self.replicas)
