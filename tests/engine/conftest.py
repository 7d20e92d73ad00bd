"""Engine test fixtures: the tiny model folder (built once into the cache) and engine factories.

GOODPUT_TEST_DEVICE=cuda runs the engine and its transformers reference on a GPU
(scripts/gpu_check.sh does); the default is the CPU.
"""

from __future__ import annotations

import os

import pytest

TEST_DEVICE = os.environ.get("GOODPUT_TEST_DEVICE", "cpu")

import engine  # noqa: F401  (sets OMP_WAIT_POLICY=PASSIVE before torch loads; see engine/__init__.py)


@pytest.fixture(scope="session")
def tiny_folder():
    from engine.weights.tiny import tiny_folder as build

    return build(progress=lambda _msg: None)


@pytest.fixture(scope="session")
def tiny_state(tiny_folder):
    from engine.weights.hf import load_config, load_state_dict

    return load_config(tiny_folder), load_state_dict(tiny_folder)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_folder):
    from engine.tokenizer import Tokenizer

    return Tokenizer(tiny_folder)


@pytest.fixture
def make_engine(tiny_state, tiny_tokenizer):
    """make_engine(**EngineConfig fields) -> LLMEngine on the tiny model (2 threads, fp32)."""
    from engine.config import EngineConfig
    from engine.core import LLMEngine

    def make(**kwargs):
        kwargs.setdefault("max_model_len", 1024)
        kwargs.setdefault("num_threads", 2)
        kwargs.setdefault("device", TEST_DEVICE)
        cfg, state = tiny_state
        return LLMEngine(cfg, state, EngineConfig(**kwargs), tiny_tokenizer)

    return make


@pytest.fixture(scope="session")
def hf_tiny(tiny_folder):
    """transformers' LlamaForCausalLM on exactly the tiny model's weights (the reference)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32)
    return model.to(TEST_DEVICE).eval()


@pytest.fixture(scope="session")
def hf_tiny_bf16(tiny_folder):
    """The same reference in bfloat16 (transformers' own bfloat16 maths)."""
    import torch
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_folder, dtype=torch.bfloat16).to(TEST_DEVICE).eval()
