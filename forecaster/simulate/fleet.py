"""A fleet of replicas serving a per-request trace, advanced in fixed ticks.

Each replica is one engine with continuous batching and chunked prefill, as vLLM V1 schedules:
every engine step carries one token for each decoding sequence plus up to `step_token_budget`
prompt tokens, so a step with a prefill chunk costs step(d) + chunk / prefill_rate. Within a
tick the replica first works through its prefill backlog (FIFO) in such mixed steps, then runs
pure decode steps; first-token and finish times are placed inside the tick from that timeline.
A request is *waiting* (vLLM's num_requests_waiting) until its first prompt chunk is scheduled,
which happens only when the tick still has prefill budget, a batch slot and KV room for the
request's prompt + output (reserved up front, so there are no preemptions).

Routing: least outstanding requests among ready replicas, at the start of the tick after the
request arrived (so scheduling is late by under one tick, never early). Replicas start cold
(counted as cost, not serving) and drain when removed (finish everything they hold, take nothing
new). A request whose prompt + output can never fit in one replica's KV cache is dropped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from forecaster.simulate.profiles import ServiceProfile
from forecaster.simulate.traces import RequestTrace


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

    @property
    def in_flight(self) -> float:
        return self.waiting + self.running

    @property
    def spec_replicas(self) -> int:
        return self.ready + self.starting


class RequestFleet:
    """Owns replicas and every request's progress; set_replicas() is the only control input."""

    def __init__(self, profile: ServiceProfile, trace: RequestTrace, initial_replicas: int,
                 cold_start_s: float, tick_s: float = 0.1):
        if tick_s <= 0 or cold_start_s < 0 or initial_replicas < 0:
            raise ValueError("tick_s must be > 0, cold_start_s >= 0 and initial_replicas >= 0")
        self.profile, self.cold_start_s, self.tick_s = profile, cold_start_s, tick_s
        self.arrival = np.asarray(trace.arrival_s, dtype=float)
        self.prompt = np.asarray(trace.prompt_tokens, dtype=float)
        self.output = np.maximum(1.0, np.asarray(trace.output_tokens, dtype=float))
        n = len(self.arrival)
        self.prefill_left = self.prompt.copy()
        self.decoded = np.zeros(n)
        self.t_first = np.full(n, np.nan)
        self.t_done = np.full(n, np.nan)
        self.dropped = np.zeros(n, dtype=bool)
        self.good = np.zeros(n, dtype=bool)
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
        self._good_total = 0
        self._finished_total = 0
        self._dropped_total = 0
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
        self.replica_s += len(self.replicas) * dt

    def _route(self, now: float) -> None:
        end = int(np.searchsorted(self.arrival, now, side="right"))
        kv_cap = self.profile.kv_capacity_tokens
        for i in range(self.next_index, end):
            self._input_total += self.prompt[i]
            if self.prompt[i] + self.output[i] > kv_cap:
                self.dropped[i] = True
                self._dropped_total += 1
            else:
                self.router_queue.append(i)
        self.next_index = end
        targets = [r for r in self.replicas if not r.draining and r.ready_s <= now]
        if not targets or not self.router_queue:
            return
        load = np.array([r.outstanding for r in targets])
        while self.router_queue:
            k = int(np.argmin(load))
            targets[k].waiting.append(self.router_queue.popleft())
            load[k] += 1

    def _serve(self, r: Replica, now: float, dt: float) -> float:
        """One tick of one replica; returns the seconds it computed."""
        p = self.profile
        rate, budget = p.prefill_tokens_per_s, float(p.step_token_budget)
        run = np.array(r.running, dtype=np.int64)
        decoding = run[self.prefill_left[run] <= 0] if len(run) else run
        d = len(decoding)
        s_mix = (p.step_s(d) if d else 0.0) + budget / rate  # a step carrying a full prompt chunk
        tick_prefill = budget * dt / s_mix                    # prompt tokens this tick can take
        backlog = float(self.prefill_left[run].sum()) if len(run) else 0.0
        # Schedule waiting requests while this tick has prompt budget, a slot and KV room.
        while r.waiting and backlog < tick_prefill and len(r.running) < p.max_batch:
            i = r.waiting[0]
            need = self.prompt[i] + self.output[i]
            if r.kv_reserved + need > p.kv_capacity_tokens:
                break
            r.waiting.popleft()
            r.running.append(i)
            r.kv_reserved += need
            backlog += self.prefill_left[i]
        run = np.array(r.running, dtype=np.int64)
        prefilling = run[self.prefill_left[run] > 0]
        rate_eff = budget / s_mix
        t_prefill = min(dt, backlog / rate_eff)
        done_tokens = rate_eff * t_prefill
        # Prefill FIFO: who completes its prompt inside this tick, and when (first token).
        cum = np.cumsum(self.prefill_left[prefilling])
        completes = cum <= done_tokens + 1e-9
        new_dec = prefilling[completes]
        first_at = cum[completes] / rate_eff
        self.t_first[new_dec] = now + first_at
        self.decoded[new_dec] = 1.0
        self.prefill_left[new_dec] = 0.0
        partial = prefilling[~completes]
        if len(partial):
            self.prefill_left[partial[0]] = cum[len(new_dec)] - done_tokens
        self._output_total += len(new_dec)
        # Decode timeline: mixed steps (s_mix each) until t_prefill, pure steps after.
        s_pure = p.step_s(d + len(new_dec))
        ids = np.concatenate([decoding, new_dec])
        start = np.concatenate([np.zeros(d), first_at])
        steps_before = np.where(start <= t_prefill, start / s_mix, t_prefill / s_mix + (start - t_prefill) / s_pure)
        steps_total = t_prefill / s_mix + (dt - t_prefill) / s_pure
        remaining = self.output[ids] - self.decoded[ids]
        avail = steps_total - steps_before
        finish = remaining <= avail + 1e-9
        k = steps_before[finish] + remaining[finish]  # step index (from tick start) of the last token
        offset = np.where(k <= t_prefill / s_mix, k * s_mix, t_prefill + (k - t_prefill / s_mix) * s_pure)
        fin = ids[finish]
        self.t_done[fin] = now + offset
        gained = np.where(finish, remaining, np.maximum(avail, 0.0))
        self.decoded[ids] += gained
        self._output_total += float(gained.sum())
        busy = t_prefill
        if len(ids):
            busy = dt if (~finish).any() else max(t_prefill, float(offset.max(initial=0.0)))
        if len(fin):
            slo = p.slo
            ttft = self.t_first[fin] - self.arrival[fin]
            out = self.output[fin]
            tpot = np.where(out > 1, (self.t_done[fin] - self.t_first[fin]) / np.maximum(out - 1, 1), 0.0)
            self.good[fin] = (ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)
            self._good_total += int(self.good[fin].sum())
            self._finished_total += len(fin)
            done = set(fin.tolist())
            r.running = [i for i in r.running if i not in done]
            r.kv_reserved -= float((self.prompt[fin] + self.output[fin]).sum())
        self._busy_total += busy
        return busy

    # -- observation ------------------------------------------------------------------------
    def view(self, now: float) -> FleetView:
        ready = [r for r in self.replicas if not r.draining and r.ready_s <= now]
        starting = sum(1 for r in self.replicas if r.ready_s > now)
        draining = sum(1 for r in self.replicas if r.draining)
        cap = self.profile.kv_capacity_tokens
        kv = []
        for r in ready:
            run = np.array(r.running, dtype=np.int64)
            used = float((self.prompt[run] - self.prefill_left[run] + self.decoded[run]).sum()) if len(run) else 0.0
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
        )

    @property
    def idle(self) -> bool:
        """Every request has arrived and none is held anywhere."""
        return self.next_index >= len(self.arrival) and not self.router_queue and \
            all(not r.waiting and not r.running for r in self.replicas)
