"""Engine configuration, validated where it is built (the CLI or a test), plain values inside.

`ModelConfig` describes the Llama-family network (read from a checkpoint's config.json);
`EngineConfig` holds the serving knobs (KV budget, batching, caching). Inner classes take plain
arguments, so tests can build a scheduler or block pool without either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # HF-style rope_scaling dict (llama3 / linear) or None; applied to the inverse frequencies.
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads ({self.num_kv_heads})")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model config {name} must be positive, got {getattr(self, name)}")

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        """From a Hugging Face LlamaConfig dict (config.json)."""
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        if cfg.get("model_type", "llama") not in ("llama", "mistral") and "LlamaForCausalLM" not in archs:
            raise ValueError(f"unsupported architecture {archs[0]!r} (model_type {cfg.get('model_type')!r}); only Llama-family decoders load")
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return cls(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
            num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5), rope_theta=cfg.get("rope_theta", 10000.0),
            rope_scaling=cfg.get("rope_scaling"),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", True),
            bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos_ids,
        )

    def to_hf(self) -> dict:
        """A config.json that transformers' LlamaForCausalLM loads with the same numbers."""
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling, "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings, "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
        }

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


@dataclass
class EngineConfig:
    """Serving knobs. Defaults follow vLLM where it has one."""

    block_size: int = 16
    # Exactly one of these sizes the KV cache; num_blocks wins when both are given.
    kv_cache_memory: int = 512 * 2**20
    num_blocks: int | None = None
    # vLLM's GPU default is 2048 or more; on a 2-core CPU at ~3 ms a prefill token that is a
    # 6 s step during which every running decode waits. 512 bounds the stall near 1.5 s while a
    # 512-row GEMM still runs at full matmul rate.
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    device: str = "cpu"
    # "auto" is resolved once the model is known (engine.dtype.choose_dtype, in LLMEngine).
    dtype: str = "float32"
    seed: int = 0
    # The CPUs this process may run on (taskset, cgroup cpusets), not every CPU of the machine:
    # more threads than cores makes OpenMP threads wait on each other.
    num_threads: int = field(default_factory=lambda: len(os.sched_getaffinity(0)) or 1)

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"--block-size must be a positive power of two, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"--num-blocks must be at least 1, got {self.num_blocks}")
        if self.kv_cache_memory <= 0:
            raise ValueError("--kv-cache-memory must be positive (e.g. 512MiB)")
        if self.max_num_batched_tokens < 1:
            raise ValueError("--max-num-batched-tokens must be at least 1")
        if self.max_num_seqs < 1:
            raise ValueError("--max-num-seqs must be at least 1")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"--dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")

    def resolve(self, model: ModelConfig, dtype: str | None = None) -> "ResolvedLimits":
        """Block count and context length once the model (and, for --dtype auto, the dtype) is known."""
        import torch

        dtype = dtype or self.dtype
        if dtype == "auto":
            raise ValueError("resolve the dtype first (engine.dtype.choose_dtype)")
        dtype_bytes = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
        per_block = model.kv_bytes_per_token(dtype_bytes) * self.block_size
        num_blocks = self.num_blocks if self.num_blocks is not None else self.kv_cache_memory // per_block
        if num_blocks < 1:
            raise ValueError(f"--kv-cache-memory {self.kv_cache_memory} bytes holds no block of {per_block} bytes; raise it")
        max_model_len = self.max_model_len or model.max_position_embeddings
        if max_model_len > model.max_position_embeddings:
            raise ValueError(f"--max-model-len {max_model_len} exceeds the model's context of {model.max_position_embeddings}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < max_model_len:
            # Without chunking a whole prompt must fit in one step's token budget.
            max_num_batched_tokens = max_model_len
        else:
            max_num_batched_tokens = self.max_num_batched_tokens
        return ResolvedLimits(num_blocks=int(num_blocks), max_model_len=max_model_len,
                              max_num_batched_tokens=max_num_batched_tokens)


@dataclass(frozen=True)
class ResolvedLimits:
    num_blocks: int
    max_model_len: int
    max_num_batched_tokens: int


def parse_bytes(text: str) -> int:
    """'512MiB', '1GiB', '1.5GB', '1000000' -> bytes."""
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "k": 2**10, "m": 2**20, "g": 2**30, "b": 1}
    t = text.strip().lower()
    for suffix in sorted(units, key=len, reverse=True):
        if t.endswith(suffix):
            number, mult = t[: -len(suffix)], units[suffix]
            break
    else:
        number, mult = t, 1
    try:
        value = float(number) * mult
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a size; write e.g. 512MiB or 2GiB") from None
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return int(value)
