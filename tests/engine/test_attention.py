"""Decode sequences are attended in groups of similar context length: the split is the cheapest,
and a long context no longer pads every short one."""

from __future__ import annotations

import random

from engine import attention
from engine.attention import GROUP_COST_SLOTS, _group_by_length


def cost(groups: list[list[int]], lengths: list[int], block: int) -> int:
    width = lambda i: -(-lengths[i] // block) * block   # noqa: E731
    return sum(GROUP_COST_SLOTS + len(g) * max(width(i) for i in g) for g in groups)


def partitions(items: list[int]):
    """Every set partition of `items` (Bell(7) = 877 of seven)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield part[:i] + [[first, *part[i]]] + part[i + 1:]


def test_split_is_the_cheapest_of_every_partition():
    rng = random.Random(3)
    for _ in range(60):
        n = rng.randint(1, 7)
        lengths = [rng.choice([rng.randint(1, 64), rng.randint(1, 2048)]) for _ in range(n)]
        groups = _group_by_length(lengths, 16)
        assert sorted(i for g in groups for i in g) == list(range(n))
        assert all(g == sorted(g) for g in groups)            # batch order within a group
        best = min(cost(p, lengths, 16) for p in partitions(list(range(n))))
        assert cost(groups, lengths, 16) == best, (lengths, groups)


def test_one_long_context_gets_its_own_group():
    groups = _group_by_length([70] * 31 + [540] + [70] * 32, 16)
    assert groups == [[i for i in range(64) if i != 31], [31]]
    assert _group_by_length([5, 70, 30], 16) == [[0, 1, 2]]       # close lengths: one batch


def test_metadata_pads_each_group_to_its_own_longest():
    lengths = [70] * 7 + [540]
    seqs, block = [], 0
    for row, n in enumerate(lengths):
        blocks = list(range(block, block + -(-n // 16)))
        block += len(blocks)
        seqs.append((row, 1, n, blocks))
    meta = attention.AttentionMetadata.build(seqs, 16)
    assert [tuple(g.slots.shape) for g in meta.decode_groups] == [(7, 70), (1, 540)]
    assert meta.decode_groups[0].mask is None                  # equal lengths: no mask
    assert [g.rows.tolist() for g in meta.decode_groups] == [list(range(7)), [7]]
