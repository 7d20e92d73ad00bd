"""Per-request view of the KV cache: block tables, prefix hits, and caching full blocks.

Block hashes are chained: hash(block i) covers the parent's hash, the request's salt and the
block's token ids, so equal hashes mean equal whole prefixes (and the same tenant). Only full
blocks are hashed.
"""

from __future__ import annotations

import hashlib
import struct

from engine.block_pool import Block, BlockPool


def hash_block(parent: bytes | None, token_ids: list[int], salt: str | None) -> bytes:
    h = hashlib.sha256(parent or b"root")
    if salt:
        h.update(b"salt:" + salt.encode())
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching)
        self.enable_caching = enable_caching
        self.block_tables: dict[str, list[Block]] = {}
        self._hashes: dict[str, list[bytes]] = {}
        # Prefix-cache counters in tokens, as vLLM counts them.
        self.num_queries = 0
        self.num_hits = 0

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.block_tables.get(request_id, [])]

    def _block_hashes(self, request_id: str, token_ids: list[int], salt: str | None) -> list[bytes]:
        """Hashes of every full block of token_ids, extending the request's memo."""
        hashes = self._hashes.setdefault(request_id, [])
        bs = self.block_size
        for i in range(len(hashes), len(token_ids) // bs):
            hashes.append(hash_block(hashes[-1] if hashes else None, token_ids[i * bs:(i + 1) * bs], salt))
        return hashes

    def get_computed_blocks(self, request_id: str, token_ids: list[int], salt: str | None) -> list[Block]:
        """The longest cached prefix, in whole blocks. At least one token is left to compute,
        since the last position's logits are needed to sample."""
        if not self.enable_caching:
            return []
        hashes = self._block_hashes(request_id, token_ids, salt)
        max_blocks = (len(token_ids) - 1) // self.block_size
        hits = []
        for h in hashes[:max_blocks]:
            block = self.pool.get_cached_block(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count a lookup once, when the request really starts (a request that has to wait is
        looked up again next step)."""
        if self.enable_caching:
            self.num_queries += num_tokens
            self.num_hits += num_hit_tokens

    def num_blocks_needed(self, request_id: str, num_tokens: int, new_computed: list[Block]) -> int:
        have = len(self.block_tables.get(request_id, [])) + len(new_computed)
        return max(0, -(-num_tokens // self.block_size) - have)

    def can_allocate(self, request_id: str, num_tokens: int, new_computed: list[Block]) -> bool:
        # Reviving a free cached block takes it out of the free queue too.
        revived = sum(1 for b in new_computed if b.ref_cnt == 0)
        return self.num_blocks_needed(request_id, num_tokens, new_computed) <= self.pool.num_free_blocks - revived

    def allocate(self, request_id: str, num_tokens: int, new_computed: list[Block],
                 token_ids: list[int], salt: str | None) -> list[int]:
        """Grow the request's table to hold num_tokens (computed + this step's), take the prefix
        hits, and cache every block that is full of known tokens. Returns the block table."""
        assert self.can_allocate(request_id, num_tokens, new_computed)
        need = self.num_blocks_needed(request_id, num_tokens, new_computed)
        self.pool.touch(new_computed)
        table = self.block_tables.setdefault(request_id, [])
        table.extend(new_computed)
        table.extend(self.pool.get_new_blocks(need))
        if self.enable_caching:
            full = min(num_tokens, len(token_ids)) // self.block_size
            hashes = self._block_hashes(request_id, token_ids[: full * self.block_size], salt)
            for block, h in zip(table[:full], hashes):
                self.pool.cache_block(block, h)
        return [b.block_id for b in table]

    def free(self, request_id: str) -> None:
        """Release the request's blocks, tail first (the order they should be evicted)."""
        table = self.block_tables.pop(request_id, [])
        self._hashes.pop(request_id, None)
        self.pool.free_blocks(list(reversed(table)))

    def usage(self) -> float:
        return self.pool.usage()
