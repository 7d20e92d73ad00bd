"""Next-token sampling: greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import torch

from engine.request import SamplingParams


class Sampler:
    def __init__(self, seed: int = 0):
        self._default = torch.Generator().manual_seed(seed)
        # A seeded request owns its generator, so its tokens do not depend on what else runs.
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._default
        g = self._generators.get(request_id)
        if g is None:
            g = self._generators[request_id] = torch.Generator().manual_seed(params.seed)
        return g

    def sample(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]) -> list[int]:
        """logits: (n, vocab) float32, one row per request."""
        out = logits.argmax(dim=-1).tolist()
        for i, (rid, p) in enumerate(zip(request_ids, params)):
            if p.greedy:
                continue
            row = logits[i] / p.temperature
            if p.top_k > 0 and p.top_k < row.shape[0]:
                kth = torch.topk(row, p.top_k).values[-1]
                row = row.masked_fill(row < kth, float("-inf"))
            probs = torch.softmax(row, dim=-1)
            if p.top_p < 1.0:
                sorted_p, idx = torch.sort(probs, descending=True)
                # Keep the smallest set whose mass reaches top_p (the first token always stays).
                drop = (sorted_p.cumsum(0) - sorted_p) >= p.top_p
                drop[0] = False     # a top_p below float32's smallest value rounds to 0 and dropped it
                sorted_p = sorted_p.masked_fill(drop, 0.0)
                probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p)
            total = float(probs.sum())
            if not (total > 0 and total < float("inf")):
                # A temperature so small that logits / T overflowed: the limit is greedy. Sampling
                # would raise and fail every request in the batch, not just this one.
                continue
            out[i] = int(torch.multinomial(probs, 1, generator=self._generator(rid, p)))
        return out
