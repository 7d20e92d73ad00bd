"""Greedy tokens and logits of the engine against transformers' LlamaForCausalLM, same weights,
same dtype, same device. float32 is expected to match exactly (greedy) and within 1e-3 (logits);
in bfloat16 two correct implementations round differently once sums are ordered differently, so
the result says how far they agree: the share of greedy tokens identical up to each prompt's
first divergence, and where the first one is. The engine runs the prompts both one at a time (as
transformers does) and together in one batch: in bfloat16 a batched step's kernels round
differently from a single row's (vLLM's batch invariance problem), which the two numbers separate.

`python -m engine.parity --model tiny --dtype bfloat16 --json FILE` (scripts/gpu_check.sh runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

# The README's example requests and a longer passage, as raw text.
PROMPTS = (
    "Name three primary colors.",
    "Say hi.",
    "What is the capital of France? Answer in one sentence.",
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps as his "
    "father had taught him, one hundred and twelve, and lit the great lamp that warned ships away from the rocks.",
)


@dataclass
class ParityResult:
    dtype: str
    device: str
    batched: bool                     # all prompts in one engine batch, or one at a time
    num_prompts: int
    tokens_per_prompt: int
    identical_prefix_tokens: int      # summed over prompts: tokens equal before the first divergence
    total_tokens: int
    identical_prompts: int            # prompts whose whole greedy continuation is identical
    first_divergence: dict | None     # {"prompt", "position", "engine", "reference"} or None
    max_abs_logit_diff: float         # over every position of the longest prompt
    argmax_agreement: float           # share of those positions with the same top token

    @property
    def identical_share(self) -> float:
        return self.identical_prefix_tokens / self.total_tokens if self.total_tokens else 1.0

    def to_json(self) -> dict:
        return {**asdict(self), "identical_share": self.identical_share}

    def summary(self) -> str:
        first = ("none" if self.first_divergence is None else
                 f"prompt {self.first_divergence['prompt']} token {self.first_divergence['position']}")
        how = "batched" if self.batched else "one at a time"
        return (f"{self.dtype} on {self.device}, {how}: {self.identical_prefix_tokens}/{self.total_tokens} greedy tokens "
                f"identical ({self.identical_share:.1%}), {self.identical_prompts}/{self.num_prompts} prompts fully; "
                f"first divergence {first}; logits max |diff| {self.max_abs_logit_diff:.3g}, "
                f"top-1 agreement {self.argmax_agreement:.1%}")


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    import torch

    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def greedy_parity(engine, hf_model, prompts: list[list[int]], n: int, batched: bool = True,
                  reference: list[list[int]] | None = None) -> ParityResult:
    """`reference`: transformers' greedy tokens for `prompts` if already computed."""
    import torch

    from engine.request import SamplingParams

    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    ours = engine.generate(prompts, params) if batched else [engine.generate([p], params)[0] for p in prompts]
    reference = reference or [hf_greedy(hf_model, p, n) for p in prompts]
    same, full, first = 0, 0, None
    for i, (got, ref) in enumerate(zip(ours, reference)):
        k = next((j for j, (a, b) in enumerate(zip(got, ref)) if a != b), n)
        same += k
        full += k == n
        if k < n and first is None:
            first = {"prompt": i, "position": k, "engine": got[k], "reference": ref[k]}
    longest = max(prompts, key=len)
    mine = engine.runner.logits(longest).float().cpu()
    with torch.inference_mode():
        theirs = hf_model(torch.tensor([longest], device=hf_model.device)).logits[0].float().cpu()
    return ParityResult(dtype=engine.dtype, device=str(engine.runner.device), batched=batched, num_prompts=len(prompts),
                        tokens_per_prompt=n, identical_prefix_tokens=same, total_tokens=n * len(prompts),
                        identical_prompts=full, first_divergence=first,
                        max_abs_logit_diff=(mine - theirs).abs().max().item(),
                        argmax_agreement=(mine.argmax(-1) == theirs.argmax(-1)).float().mean().item())


def main(argv=None) -> int:
    import torch
    from transformers import LlamaForCausalLM

    from engine.config import EngineConfig
    from engine.core import LLMEngine
    from engine.weights import resolve_model

    ap = argparse.ArgumentParser(prog="python -m engine.parity", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    ap.add_argument("--json", default=None, help="also write the result as JSON here")
    args = ap.parse_args(argv)
    folder, _ = resolve_model(args.model, lambda m: print(m, file=sys.stderr))
    engine = LLMEngine.from_folder(folder, EngineConfig(device=args.device, dtype=args.dtype, max_model_len=1024,
                                                        num_blocks=256))
    hf = LlamaForCausalLM.from_pretrained(folder, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    reference = [hf_greedy(hf, p, args.tokens) for p in prompts]
    results = [greedy_parity(engine, hf, prompts, args.tokens, batched, reference) for batched in (False, True)]
    for res in results:
        print(res.summary())
    if args.json:
        with open(args.json, "w") as f:
            json.dump([res.to_json() for res in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
