"""Tokenizer, chat template and incremental detokenizer, from a folder's tokenizer files.

The chat template is the model's own (tokenizer_config.json, taken from the GGUF metadata),
rendered with jinja2 the way transformers does: sandboxed, trim_blocks, lstrip_blocks.
"""

from __future__ import annotations

import json
from pathlib import Path


class TemplateError(ValueError):
    """The messages could not be rendered with the model's chat template."""


class Tokenizer:
    def __init__(self, folder: Path):
        from tokenizers import Tokenizer as HFTokenizer

        self.folder = Path(folder)
        self.path = self.folder / "tokenizer.json"
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path} is missing; a model folder needs tokenizer.json")
        self._tok = HFTokenizer.from_file(str(self.path))
        cfg_path = self.folder / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.chat_template: str | None = cfg.get("chat_template")
        if not self.chat_template and (self.folder / "chat_template.jinja").is_file():
            self.chat_template = (self.folder / "chat_template.jinja").read_text()  # newer HF layout
        self.bos_token = _content(cfg.get("bos_token"))
        self.eos_token = _content(cfg.get("eos_token"))
        self.add_bos = bool(cfg.get("add_bos_token", False))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.vocab_size = self._tok.get_vocab_size()
        self._template = None

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise TemplateError("this model has no chat template; use /v1/completions")
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            env.filters["tojson"] = lambda v, indent=None: json.dumps(v, indent=indent, ensure_ascii=False)
            self._template = env.from_string(self.chat_template)
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except TemplateError:
            raise
        except Exception as exc:  # jinja errors from malformed messages become a 400, not a 500
            raise TemplateError(f"cannot render messages with the chat template: {exc}") from None


def _content(tok) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


def _raise(message: str):
    raise TemplateError(message)


class IncrementalDetokenizer:
    """Text deltas from a growing list of token ids, never splitting a multi-byte character.

    Decodes a short window (prefix_offset..end) and emits what is new past read_offset, holding
    back while the window ends in U+FFFD (an incomplete UTF-8 sequence of a byte-level BPE).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids[-6:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return delta
        return ""
