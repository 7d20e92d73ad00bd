"""GGUF files: metadata, dequantized tensors, and conversion into an HF-style folder.

The conversion writes what `engine.weights.hf` (and transformers' LlamaForCausalLM) loads:
config.json, model.safetensors in float32 with HF tensor names, tokenizer.json built from the
file's `tokenizer.ggml.*` metadata and tokenizer_config.json carrying its chat template. It runs
once per file; loading the folder afterwards takes a second or two instead of dequantizing again.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# llama.cpp tensor names -> HF names ("{i}" is the layer index).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Types the gguf package dequantizes that we accept (the list plus close relatives).
SUPPORTED_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


class GGUFError(ValueError):
    """The file cannot be used; the message names what is unsupported."""


class GGUFFile:
    def __init__(self, path: Path):
        import gguf

        self.path = Path(path)
        try:
            self.reader = gguf.GGUFReader(str(self.path))
        except Exception as exc:  # the reader raises plain ValueError/OSError on bad files
            raise GGUFError(f"{self.path} is not a readable GGUF file ({exc})") from None
        self.arch = self.get("general.architecture")
        if self.arch != "llama":
            raise GGUFError(f"{self.path.name}: unsupported architecture {self.arch!r}; only 'llama' GGUF files load")

    def get(self, key: str, default=None):
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str):
        value = self.get(key)
        if value is None:
            raise GGUFError(f"{self.path.name}: metadata key {key} is missing")
        return value

    def model_config(self) -> dict:
        a = self.arch
        heads = self.require(f"{a}.attention.head_count")
        hidden = self.require(f"{a}.embedding_length")
        tokens = self.get("tokenizer.ggml.tokens") or []
        has_output = any(t.name == "output.weight" for t in self.reader.tensors)
        scaling = None
        if self.get(f"{a}.rope.scaling.type") in ("linear",):
            scaling = {"rope_type": "linear", "factor": float(self.get(f"{a}.rope.scaling.factor"))}
        elif self.get(f"{a}.rope.scaling.type") not in (None, "none"):
            raise GGUFError(f"{self.path.name}: rope scaling {self.get(f'{a}.rope.scaling.type')!r} is not supported")
        eos = self.get("tokenizer.ggml.eos_token_id")
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": self.get(f"{a}.vocab_size") or len(tokens), "hidden_size": hidden,
            "intermediate_size": self.require(f"{a}.feed_forward_length"),
            "num_hidden_layers": self.require(f"{a}.block_count"), "num_attention_heads": heads,
            "num_key_value_heads": self.get(f"{a}.attention.head_count_kv") or heads,
            "head_dim": self.get(f"{a}.rope.dimension_count") or hidden // heads,
            "rms_norm_eps": float(self.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
            "rope_theta": float(self.get(f"{a}.rope.freq_base", 10000.0)), "rope_scaling": scaling,
            "max_position_embeddings": self.get(f"{a}.context_length", 2048),
            "tie_word_embeddings": not has_output, "hidden_act": "silu", "torch_dtype": "float32",
            "bos_token_id": self.get("tokenizer.ggml.bos_token_id"), "eos_token_id": eos,
        }

    def tensors(self):
        """Yield (hf_name, float32 array) with Q and K un-permuted back to HF's rotary layout."""
        from gguf import quants

        heads = self.require(f"{self.arch}.attention.head_count")
        kv_heads = self.get(f"{self.arch}.attention.head_count_kv") or heads
        for t in self.reader.tensors:
            if t.tensor_type.name not in SUPPORTED_TYPES:
                raise GGUFError(f"{self.path.name}: tensor {t.name} has unsupported type {t.tensor_type.name}")
            name = _hf_name(t.name)
            if name is None:
                continue  # e.g. rope_freqs: derived from the config instead
            data = quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            data = data.reshape([int(d) for d in reversed(t.shape)])
            if name.endswith("q_proj.weight"):
                data = _unpermute(data, heads)
            elif name.endswith("k_proj.weight"):
                data = _unpermute(data, kv_heads)
            yield name, data


def _hf_name(gguf_name: str) -> str | None:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        hf = _LAYER_NAMES.get(parts[2])
        return None if hf is None else f"model.layers.{parts[1]}.{hf}.{parts[-1]}"
    hf = _TOP_NAMES.get(parts[0])
    return None if hf is None else f"{hf}.{parts[-1]}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's converter interleaves each head's rotary halves (HF rotate_half pairs i with
    # i + d/2; GGML's rope pairs 2i with 2i+1). Undo it exactly as transformers' GGUF loader does.
    dim = w.shape[0] // n_head // 2
    return np.ascontiguousarray(w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape))


def build_tokenizer(gguf: GGUFFile):
    """A `tokenizers` byte-level BPE from tokenizer.ggml.* (gpt2-style models)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = gguf.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{gguf.path.name}: tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens = gguf.get("tokenizer.ggml.tokens")
    types = gguf.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in gguf.get("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if gguf.get("tokenizer.ggml.pre") in ("smollm", "starcoder", "refact", "deepseek-coder"):
        # llama.cpp's smollm pre-tokenizer splits every digit on its own before the GPT-2 regex.
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    # Control (3) and user-defined (4) tokens are matched whole, never split by BPE.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty in (3, 4)])
    return tok


def write_tokenizer_files(gguf: GGUFFile, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer(gguf).save(str(folder / "tokenizer.json"))
    tokens = gguf.get("tokenizer.ggml.tokens")

    def tok(key):
        idx = gguf.get(key)
        return tokens[idx] if idx is not None and idx < len(tokens) else None

    config = {
        "chat_template": gguf.get("tokenizer.chat_template"),
        "bos_token": tok("tokenizer.ggml.bos_token_id"), "eos_token": tok("tokenizer.ggml.eos_token_id"),
        "unk_token": tok("tokenizer.ggml.unknown_token_id"), "pad_token": tok("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(gguf.get("tokenizer.ggml.add_bos_token", False)),
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": gguf.model_config()["max_position_embeddings"],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def convert_gguf_to_folder(path: Path, folder: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from engine.weights.fetch import publish_folder, temp_sibling

    gguf = GGUFFile(path)
    tmp = temp_sibling(folder)
    tmp.mkdir(parents=True, exist_ok=True)
    state = {name: torch.from_numpy(np.array(arr, dtype=np.float32)) for name, arr in gguf.tensors()}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt", "source": path.name})
    (tmp / "config.json").write_text(json.dumps(gguf.model_config(), indent=1))
    write_tokenizer_files(gguf, tmp)
    publish_folder(tmp, folder, "model.safetensors")
