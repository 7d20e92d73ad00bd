"""Block pool, KV manager and scheduler state, asserted exactly (no model needed)."""

from __future__ import annotations

from engine.block_pool import BlockPool
from engine.kv_manager import KVCacheManager
from engine.request import Request, SamplingParams
from engine.scheduler import Scheduler

BS = 16


def make(num_blocks=10, budget=512, max_seqs=8, chunked=True, caching=True):
    kv = KVCacheManager(num_blocks, BS, caching)
    return kv, Scheduler(kv, budget, max_seqs, chunked)


def req(rid, n, start=0, salt=None, arrival=None, max_tokens=8):
    r = Request(rid, list(range(start, start + n)), SamplingParams(max_tokens=max_tokens, temperature=0), salt=salt)
    if arrival is not None:
        r.arrival_time = arrival
    return r


def run_step(sched, token=999):
    """One scheduled step with a fake model: every sequence that samples gets `token`."""
    out = sched.schedule()
    for s in out.seqs:
        if s.sample:
            sched.requests[s.request_id].output_token_ids.append(token)
    return out


def test_block_pool_free_queue_order_and_refcounts():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    assert (a.block_id, b.block_id) == (0, 1) and pool.free_block_ids() == [2, 3]
    pool.cache_block(a, b"h0")
    pool.touch([a])
    assert a.ref_cnt == 2
    # Freed tail first: b (uncached) goes to the front, to be reused before any cached block;
    # a stays referenced once.
    pool.free_blocks([b, a])
    assert a.ref_cnt == 1 and b.ref_cnt == 0
    assert pool.free_block_ids() == [1, 2, 3]
    pool.free_blocks([a])
    assert pool.free_block_ids() == [1, 2, 3, 0]   # cached block last: evicted only when needed
    assert pool.get_cached_block(b"h0") is a
    got = pool.get_new_blocks(4)
    assert [x.block_id for x in got] == [1, 2, 3, 0]
    assert pool.get_cached_block(b"h0") is None and pool.num_evictions == 1


def test_shared_three_block_prefix_computes_only_the_remainder():
    kv, sched = make()
    first = req("a", 3 * BS + 5)           # 53 tokens: 3 full blocks + 5
    sched.add(first)
    out = run_step(sched)
    assert out.seqs[0].block_table == [0, 1, 2, 3] and len(out.seqs[0].token_ids) == 53
    sched.finish("a", "stop")
    # a's blocks are back in the free queue: the partial block 3 first (uncached),
    # then the cached blocks in eviction order tail first: 2, 1, 0.
    assert kv.pool.free_block_ids()[:1] == [3] and kv.pool.free_block_ids()[-3:] == [2, 1, 0]
    second = req("b", 3 * BS + 9)          # same first 48 tokens, different tail
    second.prompt_token_ids[48:] = list(range(500, 509))
    sched.add(second)
    hits_before = kv.num_hits
    out = run_step(sched)
    seq = out.seqs[0]
    # The three cached blocks are reused as they are; only 57 - 48 = 9 tokens are computed.
    assert seq.block_table[:3] == [0, 1, 2]
    assert seq.start_pos == 48 and len(seq.token_ids) == 9
    assert second.num_cached_tokens == 48 and kv.num_hits - hits_before == 48
    assert [kv.pool.blocks[i].ref_cnt for i in (0, 1, 2)] == [1, 1, 1]


def test_concurrent_requests_share_blocks_with_refcounts():
    kv, sched = make()
    sched.add(req("a", 40))
    run_step(sched)                        # a: blocks 0,1 cached (full), 2 partial
    sched.add(req("b", 40))
    out = run_step(sched)
    b = next(s for s in out.seqs if s.request_id == "b")
    # b hits a's two full blocks while a still holds them: refcount 2 each.
    assert b.block_table[:2] == [0, 1] and b.start_pos == 32
    assert kv.pool.blocks[0].ref_cnt == 2 and kv.pool.blocks[1].ref_cnt == 2


def test_salted_requests_share_nothing():
    kv, sched = make()
    sched.add(req("a", 53, salt="tenant-a"))
    run_step(sched)
    sched.finish("a", "stop")
    sched.add(req("b", 53, salt="tenant-b"))
    out = run_step(sched)
    # Same tokens, other tenant: no hit, every token computed, no block of a's reused.
    assert out.seqs[0].start_pos == 0 and len(out.seqs[0].token_ids) == 53
    assert kv.num_hits == 0
    assert set(out.seqs[0].block_table).isdisjoint({0, 1, 2})
    sched.add(req("c", 53, salt="tenant-a"))
    out = run_step(sched)
    c = next(s for s in out.seqs if s.request_id == "c")
    assert c.block_table[:3] == [0, 1, 2] and c.start_pos == 48   # its own tenant still hits


def test_chunked_prefill_splits_by_token_budget_and_decodes_go_first():
    kv, sched = make(budget=32)
    sched.add(req("a", 5))
    run_step(sched)                         # a prefilled, has 1 output token
    sched.add(req("b", 70, start=100))
    out = run_step(sched)
    # a's decode (1 token) first, then b gets the remaining 31 tokens of the budget.
    assert [(s.request_id, len(s.token_ids), s.sample) for s in out.seqs] == [("a", 1, True), ("b", 31, False)]
    out = run_step(sched)
    assert [(s.request_id, s.start_pos, len(s.token_ids)) for s in out.seqs] == [("a", 6, 1), ("b", 31, 31)]
    out = run_step(sched)
    assert [(s.request_id, s.start_pos, len(s.token_ids), s.sample) for s in out.seqs] == [("a", 7, 1, True), ("b", 62, 8, True)]


def test_no_chunked_prefill_waits_for_room():
    kv, sched = make(budget=64, chunked=False)
    sched.add(req("a", 5))
    run_step(sched)
    sched.add(req("b", 64, start=100))
    out = run_step(sched)
    # 1 decode token leaves 63 < 64: b is not split, it waits for the next step.
    assert [s.request_id for s in out.seqs] == ["a"]


def test_preemption_recomputes_latest_arrival_and_frees_everything():
    kv, sched = make(num_blocks=4)
    sched.add(req("old", 31, arrival=1.0))
    sched.add(req("new", 31, start=100, arrival=2.0))
    out = run_step(sched)                   # each: 31 prompt tokens in 2 blocks -> all 4 used
    assert [s.block_table for s in out.seqs] == [[0, 1], [2, 3]]
    out = run_step(sched)                   # both at 32 tokens, still 2 blocks each
    out = run_step(sched)                   # old needs a 3rd block: "new" (latest) is preempted
    assert out.preempted_ids == ["new"] and sched.num_preemptions == 1
    new = sched.requests["new"]
    assert new.num_computed_tokens == 0 and sched.waiting[0] is new
    # new's blocks were freed tail first (3, then 2; both full and cached), and old's third
    # block took the front of the queue: block 3, evicting it. Block 2 stays cached.
    assert [(s.request_id, s.block_table) for s in out.seqs] == [("old", [0, 1, 3])]
    assert kv.pool.free_block_ids() == [2]
    sched.finish("old", "stop")
    # old frees 3 (partial, uncached: to the front), then cached 1 and 0 at the back.
    assert kv.pool.free_block_ids() == [3, 2, 1, 0]
    out = run_step(sched)
    # new resumes: its first block (tokens 100..115) is still cached, so recompute starts at 16
    # and covers the other 15 prompt tokens plus its 2 outputs; it takes 3 then 1 (evicting 1).
    seq = out.seqs[0]
    assert (seq.request_id, seq.block_table, seq.start_pos, len(seq.token_ids)) == ("new", [2, 3, 1], 16, 17)
    sched.finish("new", "abort")
    assert kv.pool.num_free_blocks == 4 and all(b.ref_cnt == 0 for b in kv.pool.blocks)
    assert kv.block_tables == {}


def test_every_block_free_after_finish_abort_preempt_mix():
    kv, sched = make(num_blocks=6, budget=40)
    for i in range(5):
        sched.add(req(f"r{i}", 20 + 7 * i, start=10 * i, arrival=float(i), max_tokens=30))
    for step in range(12):
        run_step(sched)
        if step == 3:
            sched.finish("r1", "abort")
        if step == 5:
            sched.finish("r0", "stop")
    assert sched.num_preemptions > 0
    for rid in list(sched.requests):
        sched.finish(rid, "abort")
    assert kv.pool.num_free_blocks == 6 and all(b.ref_cnt == 0 for b in kv.pool.blocks)
    assert not sched.running and not sched.waiting and kv.block_tables == {}


def test_prefix_counters_count_each_request_once():
    kv, sched = make(num_blocks=4)
    sched.add(req("a", 60))                 # 4 blocks: the whole pool
    run_step(sched)
    sched.add(req("b", 20, start=200))
    for _ in range(3):
        run_step(sched)                     # b waits: looked up every step, counted never
    assert kv.num_queries == 60 and kv.num_hits == 0
    sched.finish("a", "stop")
    run_step(sched)                         # b starts now: counted once
    assert kv.num_queries == 80


def test_no_prefix_caching_counts_nothing_and_caches_nothing():
    kv, sched = make(caching=False)
    for rid in ("a", "b"):
        sched.add(req(rid, 40))
        out = run_step(sched)
        sched.finish(rid, "stop")
        assert out.seqs[0].start_pos == 0   # the same prompt is computed in full both times
    assert kv.num_queries == 0 and kv.num_hits == 0 and kv.pool.cached == {}
