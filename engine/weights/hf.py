"""Load an HF-style Llama folder: config.json + *.safetensors (one file or shards)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.config import ModelConfig


def load_config(folder: Path) -> ModelConfig:
    return ModelConfig.from_hf(json.loads((Path(folder) / "config.json").read_text()))


def load_state_dict(folder: Path) -> dict:
    """HF tensor names -> float32 CPU tensors (the model casts and moves them)."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no .safetensors file (PyTorch .bin checkpoints are not read)")
    state: dict = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
