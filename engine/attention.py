"""Paged attention: keys and values live in a pool of fixed-size blocks, read through block tables.

The KV cache of one layer is a flat slot array of shape (num_blocks * block_size, kv_heads *
head_dim); slot = block_id * block_size + offset. Gathers use F.embedding on that 2-D layout:
measured 2.7x faster than index_select on a 3-D (slots, heads, dim) cache on this CPU. `slot_mapping` says where each new token's K/V
goes; `AttentionMetadata` says, per sequence, which slots hold its context. Decode sequences (one
query token) are attended in padded batches, grouped by context length so that a long context
does not pad every short one to its length; prefill chunks one sequence at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillSeq:
    query_start: int      # row of this sequence's first token in the flattened batch
    query_len: int
    context_len: int      # tokens attended to, including this step's
    kv_slots: torch.Tensor  # (context_len,) slots of positions 0..context_len-1
    # (query_len, context_len) causal mask offset by the cached context; None = plain causal.
    mask: torch.Tensor | None = None


@dataclass
class DecodeGroup:
    """Decode sequences attended in one padded batch: one query each, keys gathered to the
    group's longest context."""
    rows: torch.Tensor            # (n,) their rows in the flattened batch, ascending
    slots: torch.Tensor           # (n, max_context) padded slot table
    mask: torch.Tensor | None     # (n, 1, 1, max_context) True where a key is real; None if all are

    @staticmethod
    def build(members: list[tuple[int, torch.Tensor]], device) -> "DecodeGroup":
        """members: (row, slots of its context) per sequence, in batch order."""
        width = max(len(s) for _, s in members)
        table = torch.zeros(len(members), width, dtype=torch.long)
        mask = torch.zeros(len(members), width, dtype=torch.bool)
        for i, (_, s) in enumerate(members):
            table[i, : len(s)] = s
            mask[i, : len(s)] = True
        return DecodeGroup(torch.tensor([r for r, _ in members], dtype=torch.long, device=device), table.to(device),
                           # equal lengths (always at batch 1) need no mask: cheaper SDPA
                           None if bool(mask.all()) else mask[:, None, None, :].to(device))


# What one more padded group costs (its gathers, attention calls and scatters in every layer), in
# padded key slots. Timed on a SmolLM2 decode step (float32, 2-core Xeon, 2026-12-07) with the
# demo's prompt lengths, three draws a batch: 256 and 512 both cut batch 64 by about a third
# there; 512 cost least at batch 4 and 8 (+1.5 and +7 % against one group; 128 and 256: +7 to
# +11 %). scripts/decode_mixed_lengths.py times grouped against padded.
GROUP_COST_SLOTS = 512


def _group_by_length(lengths: list[int], block_size: int) -> list[list[int]]:
    """Split decode sequences into groups of similar context length, each padded to its longest.

    One padded batch costs every sequence the longest context: one 540-token sequence among 63 of
    70 took a SmolLM2 decode step at 64 on a 2-core CPU from 191-221 ms to 554-714 ms (grouped:
    207-234; scripts/decode_mixed_lengths.py). Sorted by length (rounded up to blocks), the split is the one that minimises the padded slots plus GROUP_COST_SLOTS a group,
    found exactly by dynamic programming over the distinct rounded lengths (at most
    max_model_len / block_size of them). Returns lists of indices into `lengths`, shortest group first.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    widths, counts = [], []
    for i in order:
        w = -(-lengths[i] // block_size) * block_size
        if widths and widths[-1] == w:
            counts[-1] += 1
        else:
            widths.append(w)
            counts.append(1)
    m = len(widths)
    if m == 1:
        return [list(range(len(lengths)))]
    # best[j]: least cost of the first j distinct widths; cut[j]: where its last group starts.
    best = [0.0] + [math.inf] * m
    cut = [0] * (m + 1)
    for j in range(1, m + 1):
        n = 0
        for i in range(j, 0, -1):       # last group covers widths i-1 .. j-1
            n += counts[i - 1]
            c = best[i - 1] + GROUP_COST_SLOTS + n * widths[j - 1]
            if c < best[j]:
                best[j], cut[j] = c, i - 1
    bounds, j = [], m
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    groups, starts = [], [0]
    for c in counts:
        starts.append(starts[-1] + c)
    for lo, hi in reversed(bounds):
        groups.append(sorted(order[starts[lo]:starts[hi]]))   # batch order within a group
    return groups


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor               # (num_tokens,) where each new token's K/V is written
    prefills: list[PrefillSeq]
    # Decode sequences, in groups of similar context length (each padded to its own longest).
    decode_groups: list[DecodeGroup] = field(default_factory=list)

    @staticmethod
    def build(seqs: list[tuple[int, int, int, list[int]]], block_size: int, device="cpu") -> "AttentionMetadata":
        """seqs: (query_start, query_len, context_len, block_table) in batch order."""
        slot_parts, prefills, dec = [], [], []
        offsets = torch.arange(block_size)
        for start, qlen, ctx, table in seqs:
            blocks = torch.tensor(table[: (ctx + block_size - 1) // block_size], dtype=torch.long)
            slots = (blocks[:, None] * block_size + offsets).flatten()[:ctx]
            slot_parts.append(slots[ctx - qlen:])
            if qlen == 1:
                dec.append((start, slots))
            else:
                mask = None
                if ctx != qlen:
                    # Query i sits at position ctx - qlen + i and sees keys up to it.
                    mask = (torch.arange(ctx)[None, :] <= torch.arange(ctx - qlen, ctx)[:, None]).to(device)
                prefills.append(PrefillSeq(start, qlen, ctx, slots.to(device), mask))
        meta = AttentionMetadata(slot_mapping=torch.cat(slot_parts).to(device), prefills=prefills)
        if dec:
            meta.decode_groups = [DecodeGroup.build([dec[i] for i in members], device)
                                  for members in _group_by_length([len(s) for _, s in dec], block_size)]
        return meta


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: (T, H, D); k, v: (T, KV, D) for this step's tokens; caches (slots, KV * D). Returns (T, H, D).

    Writes every new K/V first, so a sequence that shares blocks computed in this same step
    (a prefix-cache hit on a block another request fills now) reads them already filled.
    """
    T, KV, D = k.shape
    k_cache.index_copy_(0, meta.slot_mapping, k.reshape(T, KV * D))
    v_cache.index_copy_(0, meta.slot_mapping, v.reshape(T, KV * D))
    groups = meta.decode_groups
    if not meta.prefills and len(groups) == 1:
        # A pure decode step in one group: its rows are all of them, in order; nothing to scatter.
        return _attend(q, k_cache, v_cache, groups[0], scale, KV, D)
    out = torch.empty_like(q)
    for p in meta.prefills:
        qs = q[p.query_start: p.query_start + p.query_len].transpose(0, 1).unsqueeze(0)
        ks = F.embedding(p.kv_slots, k_cache).view(-1, KV, D).transpose(0, 1).unsqueeze(0)
        vs = F.embedding(p.kv_slots, v_cache).view(-1, KV, D).transpose(0, 1).unsqueeze(0)
        if p.mask is None:
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=p.mask, scale=scale, enable_gqa=True)
        out[p.query_start: p.query_start + p.query_len] = o[0].transpose(0, 1)
    for g in groups:
        out.index_copy_(0, g.rows, _attend(q.index_select(0, g.rows), k_cache, v_cache, g, scale, KV, D))
    return out


def _attend(q, k_cache, v_cache, g: DecodeGroup, scale: float, KV: int, D: int) -> torch.Tensor:
    """One query per sequence of the group (q: (n, H, D)), keys gathered into a padded (n, KV, C, D) batch."""
    n, C = g.slots.shape
    kd = F.embedding(g.slots, k_cache).view(n, C, KV, D).transpose(1, 2)
    vd = F.embedding(g.slots, v_cache).view(n, C, KV, D).transpose(1, 2)
    o = F.scaled_dot_product_attention(q.unsqueeze(2), kd, vd, attn_mask=g.mask, scale=scale, enable_gqa=True)
    return o.squeeze(2)
