"""The engine core: scheduler + runner + output processing (detokenize, stop, finish).

Single-threaded by design: the engine loop thread is its only caller in the server, tests call
it directly. `step()` runs one iteration and returns what each request produced.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig, ModelConfig
from engine.dtype import DtypeChoice, choose_dtype
from engine.kv_manager import KVCacheManager
from engine.request import Request, RequestTimes, SamplingParams
from engine.runner import ModelRunner
from engine.scheduler import Scheduler
from engine.tokenizer import IncrementalDetokenizer, Tokenizer


log = logging.getLogger("goodput.engine")


class RequestRejected(ValueError):
    """The request can never be served as asked (too long for the context or the KV budget)."""


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    text: str                      # new text since the last output
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    times: RequestTimes | None = None   # set on the finishing output only


class _OutputState:
    def __init__(self, detok: IncrementalDetokenizer | None, stops: list[str]):
        self.detok, self.stops = detok, stops
        self.text = ""          # all generated text so far
        self.sent = 0           # characters already returned
        self.hold = max((len(s) for s in stops), default=1) - 1


class LLMEngine:
    def __init__(self, model_cfg: ModelConfig, state: dict, cfg: EngineConfig, tokenizer: Tokenizer | None = None,
                 dtype_choice: DtypeChoice | None = None):
        torch.set_num_threads(cfg.num_threads)
        torch.manual_seed(cfg.seed)
        self.model_cfg, self.cfg, self.tokenizer = model_cfg, cfg, tokenizer
        # After set_num_threads: the --dtype auto probe must run with the threads the engine gets.
        self.dtype_choice = dtype_choice or choose_dtype(cfg.dtype, cfg.device, model_cfg)
        self.dtype = self.dtype_choice.dtype
        log.info("engine dtype %s (%s)", self.dtype, self.dtype_choice.detail)
        limits = cfg.resolve(model_cfg, self.dtype)
        self.num_blocks, self.max_model_len = limits.num_blocks, limits.max_model_len
        self.kv = KVCacheManager(limits.num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv, limits.max_num_batched_tokens, cfg.max_num_seqs, cfg.enable_chunked_prefill)
        dtype = getattr(torch, self.dtype)
        self.runner = ModelRunner(model_cfg, state, limits.num_blocks, cfg.block_size, limits.max_model_len,
                                  cfg.device, dtype, cfg.seed)
        self.eos_ids = set(model_cfg.eos_token_ids)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            self.eos_ids.add(tokenizer.eos_token_id)
        self._out: dict[str, _OutputState] = {}
        self.num_generation_tokens = 0
        self.num_prompt_tokens = 0
        self.num_step_tokens = 0      # tokens computed by the last step (vllm:iteration_tokens_total)

    @classmethod
    def from_folder(cls, folder: Path, cfg: EngineConfig, dtype_choice: DtypeChoice | None = None) -> "LLMEngine":
        from engine.weights.hf import load_config, load_state_dict

        return cls(load_config(folder), load_state_dict(folder), cfg, Tokenizer(folder), dtype_choice)

    def check_request(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Raise RequestRejected if the request can never be served. Reads only constants, so
        the server may call it from the event loop before handing the request over."""
        n = num_prompt_tokens
        if n == 0:
            raise RequestRejected("the prompt is empty")
        if n + params.max_tokens > self.max_model_len:
            raise RequestRejected(f"this model's maximum context length is {self.max_model_len} tokens; the prompt has "
                                  f"{n} and max_tokens asks for {params.max_tokens} more; shorten one of them")
        blocks = -(-(n + params.max_tokens) // self.cfg.block_size)
        if blocks > self.num_blocks:
            raise RequestRejected(f"the request needs {blocks} KV blocks but the cache holds {self.num_blocks}; "
                                  "lower max_tokens or raise --kv-cache-memory / --num-blocks")

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    salt: str | None = None, detokenize: bool = True, arrival_time: float | None = None) -> Request:
        """`arrival_time` (time.monotonic()) is when the server received the request, as vLLM's
        frontend stamps it: the queue time then includes the rest of the step that was running."""
        n = len(prompt_token_ids)
        self.check_request(n, params)
        req = Request(request_id, list(prompt_token_ids), params, salt=salt)
        if arrival_time is not None:
            req.arrival_time = min(float(arrival_time), req.arrival_time)
        detok = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids) if detokenize and self.tokenizer else None
        self._out[request_id] = _OutputState(detok, list(params.stop))
        self.scheduler.add(req)
        return req

    def abort(self, request_id: str) -> None:
        self.scheduler.finish(request_id, "abort")
        self._out.pop(request_id, None)
        self.runner.sampler.forget(request_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        self.num_step_tokens = sched.num_tokens
        reqs = self.scheduler.requests
        sampled = self.runner.execute(sched, {s.request_id: reqs[s.request_id].params for s in sched.seqs})
        outputs = []
        for rid, token in sampled.items():
            req = reqs[rid]
            req.output_token_ids.append(token)
            self.num_generation_tokens += 1
            if len(req.output_token_ids) == 1:
                # Counted when the prefill ends, as vLLM counts vllm:prompt_tokens (at a request's
                # first token): counted at arrival, a backlog's prompts read as computed before they were.
                self.num_prompt_tokens += len(req.prompt_token_ids)
            outputs.append(self._process(req, token))
        return outputs

    def _process(self, req: Request, token: int) -> RequestOutput:
        st, p = self._out[req.request_id], req.params
        now = time.monotonic()
        if req.first_token_time is None:
            req.first_token_time = now
        reason = None
        if not p.ignore_eos and token in self.eos_ids:
            reason = "stop"
        elif token in p.stop_token_ids:
            reason = "stop"
        if st.detok is not None and reason is None:
            st.text += st.detok.add(token)
            for s in st.stops:
                idx = st.text.find(s, max(0, st.sent - len(s)))
                if idx >= 0:
                    st.text = st.text[:idx]  # the stop string itself is not returned (OpenAI)
                    reason = "stop"
                    break
        if reason is None and len(req.output_token_ids) >= p.max_tokens:
            reason = "length"
        end = len(st.text) if reason else max(st.sent, len(st.text) - st.hold)
        delta, st.sent = st.text[st.sent:end], max(st.sent, end)
        out = RequestOutput(req.request_id, [token], delta, reason is not None, reason, len(req.prompt_token_ids),
                            len(req.output_token_ids), req.num_cached_tokens)
        if reason is not None:
            scheduled = req.scheduled_time if req.scheduled_time is not None else req.arrival_time
            out.times = RequestTimes(scheduled - req.arrival_time, req.first_token_time - scheduled,
                                     now - req.first_token_time)
            self.scheduler.finish(req.request_id, reason)
            self._out.pop(req.request_id, None)
            self.runner.sampler.forget(req.request_id)
        return out

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """Run prompts to completion (tests, benchmark); returns each one's output token ids."""
        ids = [f"gen-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
        for rid, prompt in zip(ids, prompts):
            self.add_request(rid, prompt, params, detokenize=False)
        result: dict[str, list[int]] = {rid: [] for rid in ids}
        while self.has_work():
            for out in self.step():
                result[out.request_id].extend(out.new_token_ids)
        return [result[rid] for rid in ids]
