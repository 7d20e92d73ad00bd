"""A GGUF file with every tensor type the issue lists loads, and gives transformers' logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

TYPES = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"]
H, HEADS, KV_HEADS, INTER, LAYERS = 256, 4, 2, 512, 2   # K-quants need rows that are multiples of 256


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # What llama.cpp's converter does to Q and K (the loader must undo it).
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode(w: np.ndarray, type_name: str, rng) -> tuple[np.ndarray, object]:
    """(raw array to write, GGML type). F32..Q4_1 via gguf's quantizer; Q4_K/Q6_K (which gguf-py
    cannot quantize) as random blocks with small, finite scales."""
    from gguf import GGMLQuantizationType as T, quants

    t = T[type_name]
    if type_name == "F32":
        return w.astype(np.float32), t
    if type_name == "F16":
        return w.astype(np.float16), t
    if type_name in ("Q8_0", "Q4_0", "Q4_1"):
        return quants.quantize(w, t), t
    rows, blocks = w.shape[0], w.shape[1] // 256
    if type_name == "Q4_K":      # d, dmin (f16), 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
        raw = rng.integers(0, 256, size=(rows, blocks, 144), dtype=np.uint8)
        raw[..., 0:2] = np.frombuffer(np.float16(2e-4).tobytes(), np.uint8)
        raw[..., 2:4] = np.frombuffer(np.float16(1e-4).tobytes(), np.uint8)
    else:                         # Q6_K: ql[128], qh[64], int8 scales[16], d (f16) last
        raw = rng.integers(0, 256, size=(rows, blocks, 210), dtype=np.uint8)
        raw[..., 208:210] = np.frombuffer(np.float16(2e-4).tobytes(), np.uint8)
    return raw.reshape(rows, blocks * raw.shape[-1]), t


def byte_level_alphabet() -> list[str]:
    # GPT-2's bytes_to_unicode: printable stand-ins for all 256 bytes.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + n))
            n += 1
    return chars


# A small byte-level BPE vocabulary (control tokens, 256 bytes, three merges) keeps the file and
# every GGUF reader fast; SmolLM2's full vocabulary is tested in test_tokenizer.py.
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]
TOKENS = CONTROL + byte_level_alphabet() + ["Ġt", "he", "Ġthe"]
TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def write_gguf(path) -> list[str]:
    import gguf

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(2048)
    w.add_embedding_length(H)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(H // HEADS)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    tokens = TOKENS
    w.add_token_list(tokens)
    w.add_token_types([3] * len(CONTROL) + [1] * (len(tokens) - len(CONTROL)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    used, i = [], 0

    def add(name, arr, permute_heads=None):
        nonlocal i
        type_name = TYPES[i % len(TYPES)]
        i += 1
        if permute_heads:
            arr = permute(arr, permute_heads)
        raw, t = encode(arr.astype(np.float32), type_name, rng)
        w.add_tensor(name, raw, raw_dtype=t)
        used.append(type_name)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32) * shape[-1] ** -0.5

    add("token_embd.weight", rand(len(tokens), H) * 8)
    for b in range(LAYERS):
        w.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(H, np.float32))
        w.add_tensor(f"blk.{b}.ffn_norm.weight", np.ones(H, np.float32))
        add(f"blk.{b}.attn_q.weight", rand(H, H), HEADS)
        add(f"blk.{b}.attn_k.weight", rand(H // HEADS * KV_HEADS, H), KV_HEADS)
        add(f"blk.{b}.attn_v.weight", rand(H // HEADS * KV_HEADS, H))
        add(f"blk.{b}.attn_output.weight", rand(H, H))
        add(f"blk.{b}.ffn_gate.weight", rand(INTER, H))
        add(f"blk.{b}.ffn_up.weight", rand(INTER, H))
        add(f"blk.{b}.ffn_down.weight", rand(H, INTER))
    w.add_tensor("output_norm.weight", np.ones(H, np.float32))
    add("output.weight", rand(len(tokens), H) * 8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return used


def test_gguf_with_every_listed_type_matches_transformers(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from engine.config import EngineConfig
    from engine.core import LLMEngine
    from engine.weights import resolve_model
    monkeypatch.setenv("GOODPUT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "mixed.gguf"
    used = write_gguf(path)
    assert set(used) == set(TYPES)
    folder, name = resolve_model(str(path), progress=lambda _m: None)
    assert name == "mixed"
    engine = LLMEngine.from_folder(folder, EngineConfig(num_blocks=8, max_model_len=128, num_threads=2))
    ids = engine.tokenizer.encode("Then the keeper counted 112 steps.")
    # The merges apply (' the' is one token) and the chat template came along from the metadata.
    assert TOKENS.index("Ġthe") in engine.tokenizer.encode("in the")
    assert engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ours = engine.runner.logits(ids)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = ref(torch.tensor([ids])).logits[0]
    # transformers dequantizes with the same gguf package and un-permutes Q/K its own way;
    # equal logits mean names, types, permutation and the untied head all line up.
    assert theirs.abs().max() > 1.0
    assert (ours - theirs).abs().max().item() < 1e-3


def test_unsupported_tensor_type_is_named(tmp_path):
    import gguf

    from engine.weights.gguf import GGUFError, GGUFFile

    path = tmp_path / "iq.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_head_count(1)
    w.add_tensor("blk.0.attn_q.weight", np.zeros((1, 66), np.uint8), raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="blk.0.attn_q.weight has unsupported type IQ2_XXS"):
        list(GGUFFile(path).tensors())
