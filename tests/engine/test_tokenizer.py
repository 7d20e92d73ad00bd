"""SmolLM2's tokenizer and chat template from the GGUF metadata; incremental detokenizing."""

from __future__ import annotations

import pytest

from engine.tokenizer import IncrementalDetokenizer


def test_chat_template_renders_smollm2_format(tiny_tokenizer):
    text = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    # The template in the GGUF adds SmolLM's default system prompt when none is given, wraps each
    # message in <|im_start|>role ... <|im_end|>, and opens the assistant turn.
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = tiny_tokenizer.encode(text, add_special=False)
    # Control tokens are single ids (1 = <|im_start|>, 2 = <|im_end|> in SmolLM2's vocabulary).
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2
    assert tiny_tokenizer.eos_token_id == 2


def test_digits_are_split_one_by_one(tiny_tokenizer):
    # SmolLM2's pre-tokenizer (llama.cpp's "smollm") isolates every digit: 5 digits, 5 ids 33..37
    # ('1'..'5' sit at 33..37 right after the 17 control tokens and '!' .. '0').
    assert tiny_tokenizer.encode("12345") == [33, 34, 35, 36, 37]


def test_incremental_detokenizer_never_splits_characters(tiny_tokenizer):
    text = "Café 🙂 世界, naïve résumé — done"
    ids = tiny_tokenizer.encode(text)
    # Byte-level BPE cuts multi-byte characters across tokens here (the emoji is 4 bytes).
    assert len(ids) > len(text.split())
    detok = IncrementalDetokenizer(tiny_tokenizer, tiny_tokenizer.encode("Say:"))
    deltas = [detok.add(t) for t in ids]
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
    assert "" in deltas  # at least one token was held back until its character was complete


@pytest.mark.slow
def test_tokenizer_agrees_with_transformers_gguf_loader(tiny_tokenizer):
    from transformers import AutoTokenizer

    from engine.weights.fetch import smollm2_gguf

    path = smollm2_gguf()
    ref = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in ["Hello world!", " héllo 🙂 世界", "\n\n  def f(x):\treturn x**2", " <|im_start|>user", "a  b   c\n\n\nd"]:
        assert tiny_tokenizer.encode(text) == ref.encode(text, add_special_tokens=False), text
    # transformers' GGUF converter leaves out the digit split that SmolLM2's own tokenizer.json
    # (and llama.cpp's "smollm" pre-tokenizer) has, so digits after spaces differ: ours is right.
    assert tiny_tokenizer.encode("  12345") == [256, 33, 34, 35, 36, 37]
    assert ref.encode("  12345", add_special_tokens=False) == [216, 216, 33, 34, 35, 36, 37]
    m = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    assert tiny_tokenizer.apply_chat_template(m) == ref.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
