"""Iteration-level scheduling: computed tokens catch up with known tokens, within a token budget.

There is no separate prefill or decode path. Each step, running requests go first (a decode is
one token to catch up, a chunked prefill many), then waiting ones in arrival order. A prefix-cache
hit starts a request with tokens already computed. When blocks run out, the most recently arrived
running request is preempted: its blocks are freed, its computed count returns to zero, and it
goes to the front of the waiting queue to be recomputed later.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from engine.kv_manager import KVCacheManager
from engine.request import Request, Status


@dataclass
class ScheduledSeq:
    request_id: str
    token_ids: list[int]      # tokens to compute this step
    start_pos: int            # position of token_ids[0]
    block_table: list[int]
    sample: bool              # this step reaches the last known token: sample the next one


@dataclass
class SchedulerOutput:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int,
                 enable_chunked_prefill: bool = True):
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.chunked = enable_chunked_prefill
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _chunk(self, req: Request, budget: int) -> int:
        want = req.num_tokens - req.num_computed_tokens
        if want <= budget:
            return want
        return budget if self.chunked else 0

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        self.running.remove(victim)
        self.kv.free(victim.request_id)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        victim.status = Status.WAITING
        self.waiting.appendleft(victim)
        self.num_preemptions += 1
        out.preempted_ids.append(victim.request_id)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Request, int, list[int]]] = []
        for req in list(self.running):
            if req not in self.running:
                continue  # preempted earlier in this loop
            n = self._chunk(req, budget)
            if n == 0:
                continue
            total = req.num_computed_tokens + n
            while not self.kv.can_allocate(req.request_id, total, []):
                victim = max(self.running, key=lambda r: r.arrival_time)
                self._preempt(victim, out)
                for i, (r, vn, _) in enumerate(scheduled):
                    if r is victim:  # already given tokens in this step: take them back
                        del scheduled[i]
                        budget += vn
                        break
                if victim is req:
                    break
            if req.status is Status.WAITING:
                continue
            table = self.kv.allocate(req.request_id, total, [], req.all_token_ids, req.salt)
            scheduled.append((req, n, table))
            budget -= n
            if budget == 0:
                break
        # Nothing new starts in a step that had to preempt: the pool is short already.
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted_ids:
            req = self.waiting[0]
            hits = self.kv.get_computed_blocks(req.request_id, req.all_token_ids, req.salt)
            computed = len(hits) * self.kv.block_size
            want = req.num_tokens - computed
            n = want if want <= budget else (budget if self.chunked else 0)
            if n == 0 or not self.kv.can_allocate(req.request_id, computed + n, hits):
                break
            self.waiting.popleft()
            self.kv.record_prefix_lookup(req.num_tokens, computed)
            table = self.kv.allocate(req.request_id, computed + n, hits, req.all_token_ids, req.salt)
            req.num_computed_tokens = computed
            req.num_cached_tokens = computed
            if req.scheduled_time is None:   # a preempted request keeps its first start (vLLM)
                req.scheduled_time = time.monotonic()
            req.status = Status.RUNNING
            self.running.append(req)
            scheduled.append((req, n, table))
            budget -= n
        for req, n, table in scheduled:
            start = req.num_computed_tokens
            toks = req.all_token_ids[start:start + n]
            out.seqs.append(ScheduledSeq(req.request_id, toks, start, table, start + n == req.num_tokens))
            req.num_computed_tokens += n
        return out

    def finish(self, request_id: str, reason: str) -> Request | None:
        """Remove a finished or aborted request and free its blocks at once."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req.status is Status.RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(request_id)
        req.status = Status.FINISHED
        req.finish_reason = reason
        return req
