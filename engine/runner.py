"""Runs one scheduled step: flattens every sequence's tokens into one batch, runs the model once,
samples a token for each sequence that reached its last known token."""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata
from engine.config import ModelConfig
from engine.model import LlamaModel
from engine.sampler import Sampler
from engine.scheduler import SchedulerOutput


class ModelRunner:
    def __init__(self, cfg: ModelConfig, state: dict, num_blocks: int, block_size: int, max_model_len: int,
                 device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0):
        self.block_size = block_size
        self.device = torch.device(device)
        self.model = LlamaModel(cfg, state, max_model_len, device=device, dtype=dtype)
        slots = num_blocks * block_size
        # torch.empty: pages are touched only when used, so a large budget costs no start-up time.
        width = cfg.num_kv_heads * cfg.head_dim
        self.kv_caches = [(torch.empty(slots, width, device=device, dtype=dtype),
                           torch.empty(slots, width, device=device, dtype=dtype))
                          for _ in range(cfg.num_layers)]
        self.sampler = Sampler(seed)

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, params_by_id: dict) -> dict[str, int]:
        """Returns request_id -> sampled token for sequences with sample=True."""
        if not sched.seqs:
            return {}
        ids, pos, meta_seqs, rows, row_ids = [], [], [], [], []
        start = 0
        for s in sched.seqs:
            n = len(s.token_ids)
            ids.extend(s.token_ids)
            pos.extend(range(s.start_pos, s.start_pos + n))
            meta_seqs.append((start, n, s.start_pos + n, s.block_table))
            start += n
            if s.sample:
                rows.append(start - 1)
                row_ids.append(s.request_id)
        meta = AttentionMetadata.build(meta_seqs, self.block_size, self.device)
        logits = self.model.forward(torch.tensor(ids, device=self.device), torch.tensor(pos, device=self.device),
                                    meta, self.kv_caches, torch.tensor(rows, dtype=torch.long, device=self.device))
        if not rows:
            return {}
        tokens = self.sampler.sample(logits.cpu(), row_ids, [params_by_id[r] for r in row_ids])
        return dict(zip(row_ids, tokens))

    @torch.inference_mode()
    def logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits for every position of one sequence, through a private KV block range (tests)."""
        n = len(token_ids)
        blocks = list(range(-(-n // self.block_size)))
        meta = AttentionMetadata.build([(0, n, n, blocks)], self.block_size, self.device)
        return self.model.forward(torch.tensor(token_ids, device=self.device), torch.arange(n, device=self.device),
                                  meta, self.kv_caches, torch.arange(n, device=self.device))
