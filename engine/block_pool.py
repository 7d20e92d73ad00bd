"""The physical KV blocks: reference counts, the free queue in eviction order, and hash -> block.

A block with ref_cnt 0 sits in the free queue; if it also has a hash it is a cached block that
a later request may revive (touch) until its slot is needed by get_new_blocks, which evicts from
the queue's front: least recently freed first. Requests free their blocks tail first, so a
prefix's last blocks go before its first ones (a long shared prefix survives longest).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.enable_caching = enable_caching
        # OrderedDict as an O(1) removable queue: front = next to evict.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[bytes, Block] = {}
        self.num_evictions = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that get_new_blocks can hand out (free ones, cached or not)."""
        return len(self.free_queue)

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def free_block_ids(self) -> list[int]:
        return list(self.free_queue)

    def get_cached_block(self, block_hash: bytes) -> Block | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def get_new_blocks(self, n: int) -> list[Block]:
        if n > len(self.free_queue):
            raise ValueError(f"asked for {n} blocks, {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                # Evicting a cached block: its old contents are about to be overwritten.
                del self.cached[block.block_hash]
                block.block_hash = None
                self.num_evictions += 1
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[Block]) -> None:
        """Take a reference on cached blocks (a prefix hit), reviving them from the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1

    def cache_block(self, block: Block, block_hash: bytes) -> None:
        """Register a full block under its chained hash (first writer wins)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached:
            return  # the same content already lives in another block; keep that one
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def free_blocks(self, blocks_in_eviction_order: list[Block]) -> None:
        for block in blocks_in_eviction_order:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} freed twice"
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    # Uncached blocks hold nothing reusable: hand them out before cached ones.
                    self.free_queue[block.block_id] = None
                    self.free_queue.move_to_end(block.block_id, last=False)
                else:
                    self.free_queue[block.block_id] = None

    def reset_prefix_cache(self) -> None:
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
