"""`--model tiny`: a small seeded random-weight Llama with SmolLM2's real tokenizer.

Written once as an HF folder so transformers' LlamaForCausalLM can load exactly the same numbers
in tests. The init is scaled so logits are well separated (std of a logit ~ several units):
greedy decoding then never hinges on a float rounding tie between two implementations.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from engine.config import ModelConfig

TINY_VERSION = 2
TINY_SEED = 1234


def tiny_config(eos_token_id: int = 2, bos_token_id: int = 1) -> ModelConfig:
    # GQA (4 query heads on 2 KV heads), SmolLM2's vocabulary and rope theta.
    return ModelConfig(vocab_size=49152, hidden_size=64, intermediate_size=192, num_layers=4,
                       num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5,
                       rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=False,
                       bos_token_id=bos_token_id, eos_token_ids=(eos_token_id,))


def tiny_state_dict(cfg: ModelConfig, seed: int = TINY_SEED) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)

    def rand(*shape, std):
        return torch.randn(*shape, generator=g) * std

    h, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    # Untied head: with a tied one the residual stream's own token embedding dominates the
    # logits and greedy decoding just repeats the last token, which tests little.
    state = {"model.embed_tokens.weight": rand(cfg.vocab_size, h, std=0.5),
             "lm_head.weight": rand(cfg.vocab_size, h, std=0.5),
             "model.norm.weight": 1.0 + rand(h, std=0.1)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        state.update({
            p + "input_layernorm.weight": 1.0 + rand(h, std=0.1),
            p + "post_attention_layernorm.weight": 1.0 + rand(h, std=0.1),
            p + "self_attn.q_proj.weight": rand(cfg.num_heads * cfg.head_dim, h, std=h ** -0.5),
            p + "self_attn.k_proj.weight": rand(kv, h, std=h ** -0.5),
            p + "self_attn.v_proj.weight": rand(kv, h, std=h ** -0.5),
            p + "self_attn.o_proj.weight": rand(h, cfg.num_heads * cfg.head_dim, std=h ** -0.5),
            p + "mlp.gate_proj.weight": rand(cfg.intermediate_size, h, std=h ** -0.5),
            p + "mlp.up_proj.weight": rand(cfg.intermediate_size, h, std=h ** -0.5),
            p + "mlp.down_proj.weight": rand(h, cfg.intermediate_size, std=cfg.intermediate_size ** -0.5),
        })
    return state


def smollm2_shaped_config() -> ModelConfig:
    # SmolLM2-135M-Instruct's shapes (its config.json): a model with its speed and no download.
    return ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                       num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5,
                       rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_ids=(2,))


def shaped_folder(progress=print) -> Path:
    """`--model smollm2-shaped`: seeded random weights in SmolLM2-135M's shapes, its real tokenizer.
    For measuring speed where the real weights cannot travel (a GPU machine with no network and
    a 64 MiB carry limit: the GGUF is 94 MiB); every step costs what it costs with SmolLM2."""
    return _random_folder(f"smollm2-shaped-v{TINY_VERSION}", smollm2_shaped_config(), progress)


def tiny_folder(progress=print) -> Path:
    return _random_folder(f"tiny-v{TINY_VERSION}", tiny_config(), progress)


def _random_folder(name: str, cfg: ModelConfig, progress) -> Path:
    from engine.weights.fetch import cache_dir, publish_folder, smollm2_tokenizer_folder, temp_sibling

    folder = cache_dir() / "models" / name
    if (folder / "model.safetensors").is_file():
        return folder
    from safetensors.torch import save_file

    tok_folder = smollm2_tokenizer_folder(progress)
    tmp = temp_sibling(folder)
    tmp.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_folder / name, tmp / name)
    state = tiny_state_dict(cfg)
    if cfg.tie_word_embeddings:
        del state["lm_head.weight"]
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg.to_hf(), indent=1))
    publish_folder(tmp, folder, "model.safetensors")
    return folder
