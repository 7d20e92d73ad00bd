"""Paged attention: keys and values live in a pool of fixed-size blocks, read through block tables.

The KV cache of one layer is a flat slot array of shape (num_blocks * block_size, kv_heads *
head_dim); slot = block_id * block_size + offset. Gathers use F.embedding on that 2-D layout:
measured 2.7x faster than index_select on a 3-D (slots, heads, dim) cache on this CPU. `slot_mapping` says where each new token's K/V
goes; `AttentionMetadata` says, per sequence, which slots hold its context. Decode sequences (one
query token) are attended in one padded batch; prefill chunks one sequence at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

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
class AttentionMetadata:
    slot_mapping: torch.Tensor               # (num_tokens,) where each new token's K/V is written
    prefills: list[PrefillSeq]
    # Decode sequences: rows in the flattened batch, padded slot table and its validity mask.
    decode_rows: torch.Tensor | None = None  # (B,)
    decode_slots: torch.Tensor | None = None  # (B, max_context)
    decode_mask: torch.Tensor | None = None   # (B, 1, 1, max_context) True where a key is real; None if all are

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
            width = max(len(s) for _, s in dec)
            table = torch.zeros(len(dec), width, dtype=torch.long)
            mask = torch.zeros(len(dec), width, dtype=torch.bool)
            for i, (_, s) in enumerate(dec):
                table[i, : len(s)] = s
                mask[i, : len(s)] = True
            meta.decode_rows = torch.tensor([r for r, _ in dec], dtype=torch.long, device=device)
            meta.decode_slots = table.to(device)
            if not bool(mask.all()):  # equal lengths (always at batch 1) need no mask: cheaper SDPA
                meta.decode_mask = mask[:, None, None, :].to(device)
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
    if not meta.prefills:
        # A pure decode step: rows are the sequences in order, no scatter needed.
        return _decode(q, k_cache, v_cache, meta, scale, KV, D)
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
    if meta.decode_rows is not None:
        out.index_copy_(0, meta.decode_rows, _decode(q.index_select(0, meta.decode_rows), k_cache, v_cache, meta, scale, KV, D))
    return out


def _decode(q, k_cache, v_cache, meta: AttentionMetadata, scale: float, KV: int, D: int) -> torch.Tensor:
    """One query per sequence, keys gathered into a padded (B, KV, C, D) batch. q: (B, H, D)."""
    B, C = meta.decode_slots.shape
    kd = F.embedding(meta.decode_slots, k_cache).view(B, C, KV, D).transpose(1, 2)
    vd = F.embedding(meta.decode_slots, v_cache).view(B, C, KV, D).transpose(1, 2)
    o = F.scaled_dot_product_attention(q.unsqueeze(2), kd, vd, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True)
    return o.squeeze(2)
