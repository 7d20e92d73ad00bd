"""Prompt-layout advice: the analyser alone (re-synchronising chunks, distinct prompts, privacy,
cost per request), offline on the Mooncake trace through `goodput advise`, and the worked example
through a sidecar in front of the bundled engine (tiny model, prefix caching on).
"""

from __future__ import annotations

import json
import random
import subprocess
import uuid

import httpx
import pytest

from sidecar.advice import PromptWindow, chunk_text, render
from sidecar.advisor import Advisor
from tests.support import TRACES, ServerProcess, free_port, goodput_command, load_script

MOONCAKE = TRACES / "mooncake_conversation.jsonl"
needs_traces = pytest.mark.skipif(not MOONCAKE.exists(), reason="needs ../shared/traces")
_WORDS = ("harbour pilot tide table crossing keeper lamp signal rope anchor chart vessel river mouth "
          "channel buoy light fog horn night watch log entry weather north south wind current depth").split()


def _sentence(rng: random.Random, k: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(k)).capitalize() + "."


def policy_lines(seed: int = 0, lines: int = 48) -> list[str]:
    """About 1,000 tokens of system prompt (SmolLM2's tokenizer): 48 lines of three sentences."""
    rng = random.Random(seed)
    return [" ".join(_sentence(rng, rng.randint(5, 9)) for _ in range(3)) for _ in range(lines)]


def worked_example(request_id: str, id_at_end: bool = False, seed: int = 0) -> list[dict]:
    """The worked example: the request id interpolated on the system prompt's second line (or, the
    fix, moved to its end)."""
    head = "You are the support assistant of the harbour authority."
    body = "\n".join(policy_lines(seed))
    system = (f"{head}\n{body}\nRequest id: {request_id}" if id_at_end
              else f"{head}\nRequest id: {request_id}\n{body}")
    return [{"role": "system", "content": system}, {"role": "user", "content": "Which light marks the channel?"}]


def test_chunks_resynchronise_after_a_volatile_field():
    # One line over 160 characters is cut into its sentences; a short line stays whole.
    rest = ("The keeper lights the lamp at dusk and logs the weather, the wind, the tide and every passing "
            "vessel with its name and its flag until the dawn watch comes.")
    text = f"Tide tables first. Request 8f3a at noon. {rest}\nLine two.\n"
    a = chunk_text(text)
    b = chunk_text(f"Tide tables first. Request 1b7c92e0 at noon. {rest}\nLine two.\n")
    # Same cut points around the differing sentence: the first chunk and the last two agree.
    assert len(a.hashes) == len(b.hashes) == 4
    assert a.hashes[0] == b.hashes[0] and a.hashes[1] != b.hashes[1] and a.hashes[2:] == b.hashes[2:]
    assert a.lengths[1] == len("Request 8f3a at noon. ") and sum(a.lengths) == len(text)


def test_worked_example_offline_names_the_span():
    advisor = Advisor()
    for _ in range(100):
        advisor.observe("m", None, render({"messages": worked_example(uuid.uuid4().hex)}))
    (advice,) = advisor.advice()
    # 99 of 100 requests (the first had nothing to compare with) break at the id's line, which
    # starts 1 line + "system\n" in: ~70 characters, at the default 4 characters a token.
    assert advice.span_share == pytest.approx(0.99)
    assert advice.span_offset_tokens == pytest.approx(len("system\nYou are the support assistant of the harbour "
                                                          "authority.\n") / 4)
    assert advice.span_length_tokens == pytest.approx(len(f"Request id: {uuid.uuid4().hex}\n") / 4)
    # Everything after the id line repeats: all but ~2 % of the prompt becomes cacheable.
    assert advice.reusable_share_if_moved > 0.95 and advice.prefix_reusable_share < 0.02
    assert advice.ttft_saving_seconds is None          # no prefill rate known: tokens only


def test_distinct_prompts_get_no_advice():
    advisor = Advisor()
    for i in range(60):
        # Same shape (lines of sentences, a question), different text each time.
        text = "\n".join(policy_lines(seed=1000 + i, lines=20))
        advisor.observe("m", "t", render({"messages": [{"role": "user", "content": text}]}))
    (advice,) = advisor.advice()
    assert advice.span_share == 0.0 and not advice.has_span and advice.prefix_reusable_share < 0.01
    assert advisor.report()["with_advice"] == 0


def test_a_shared_system_prompt_with_distinct_questions_is_a_prefix_not_a_span():
    advisor = Advisor()
    system = "\n".join(policy_lines(seed=3, lines=20))
    for i in range(40):
        question = "\n".join(policy_lines(seed=2000 + i, lines=4))
        advisor.observe("m", None, render({"messages": [{"role": "system", "content": system},
                                                        {"role": "user", "content": question}]}))
    (advice,) = advisor.advice()
    assert not advice.has_span and advice.prefix_reusable_share > 0.7


def test_the_window_forgets_old_prompts():
    window = PromptWindow(2)
    a, b, c = (chunk_text(f"Prompt {k}.\n" * 3) for k in "abc")
    assert window.analyse_and_add(a, 64, 8).prefix == 0
    window.analyse_and_add(b, 64, 8)
    window.analyse_and_add(c, 64, 8)
    # a left the window (capacity 2) when c came in: seen again, nothing of it is known.
    assert window.analyse_and_add(a, 64, 8).prefix == 0
    assert window.analyse_and_add(c, 64, 8).prefix == c.size


def test_nothing_of_the_prompt_text_is_kept_or_reported():
    advisor = Advisor()
    ids = [uuid.uuid4().hex for _ in range(20)]
    for rid in ids:
        advisor.observe("m", "acme", render({"messages": worked_example(rid)}))
    # Everything the advisor holds (windows' tables included) and everything it reports.
    state = repr(advisor.__dict__) + json.dumps(advisor.report())
    state += "".join(repr(vars(g.window)) + repr(list(g.recent)) for g in advisor._groups.values())
    from prometheus_client import CollectorRegistry, generate_latest
    registry = CollectorRegistry()
    registry.register(advisor)
    state += generate_latest(registry).decode()
    assert not any(rid in state for rid in ids)
    assert not any(word in state for word in ("harbour", "keeper", "Request id"))


def test_cost_per_request_on_the_hot_path():
    """The sidecar runs this once per request after the response went out. Measured here on the
    worked example's 1,270-token prompt as the least of 20 rounds of 10 requests (the machine is
    shared: the least is the cost without contention). The bound is loose so that it fails only if
    the per-chunk work stops being C (splitlines, hash, accumulate, dict.update) or the window is
    scanned per request."""
    import timeit

    advisor = Advisor()
    bodies = iter([{"messages": worked_example(uuid.uuid4().hex)} for _ in range(300)])
    for _ in range(100):
        advisor.observe("m", None, render(next(bodies)), 1270)
    rounds = timeit.repeat(lambda: advisor.observe("m", None, render(next(bodies)), 1270), number=10, repeat=20)
    per_request = min(rounds) / 10
    print(f"advice cost: {per_request * 1e6:.0f} µs per 1,270-token request (render + analyse + add)")
    assert per_request < 1e-3


def _trace_block_reuse(limit: int, block: int = 512) -> float:
    """The trace's own prefix-block reuse in tokens: a block counts once its id was seen earlier."""
    seen: set[int] = set()
    reused = total = 0
    with open(MOONCAKE) as fh:
        for line, _ in zip(fh, range(limit)):
            rec = json.loads(line)
            ids, n = rec["hash_ids"], rec["input_length"]
            lengths = [block] * len(ids)
            lengths[-1] = max(1, n - block * (len(ids) - 1))
            for h, length in zip(ids, lengths):
                total += length
                reused += length if h in seen else 0
            seen.update(ids)
    return reused / total


@needs_traces
@pytest.mark.parametrize("limit", [500, 3000])
def test_mooncake_exact_prefix_share_matches_the_traces_block_reuse(tmp_path, limit):
    out = tmp_path / "advice.json"
    proc = subprocess.run(goodput_command("advise", "--records", str(MOONCAKE), "--limit", str(limit),
                                          "--json", str(out)), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    (group,) = report["groups"]
    assert report["requests"] == group["requests"] == limit
    # The advisor chains chunk keys itself; the trace's ids are already prefix hashes. Same window.
    assert abs(group["prefix_reusable_share"] - _trace_block_reuse(limit)) < 0.02
    assert "exact-prefix reusable" in proc.stdout


@needs_traces
def test_advise_reads_load_generator_records_and_refuses_files_without_prompts(tmp_path):
    records = tmp_path / "records.jsonl"
    with open(MOONCAKE) as fh, open(records, "w") as out:
        for i, (line, _) in enumerate(zip(fh, range(300))):
            rec = json.loads(line)
            out.write(json.dumps({"index": i, "input_tokens": rec["input_length"], "hash_ids": rec["hash_ids"],
                                  "outcome": "good"}) + "\n")
    proc = subprocess.run(goodput_command("advise", "--records", str(records), "--json", str(tmp_path / "a.json")),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert abs(json.loads((tmp_path / "a.json").read_text())["groups"][0]["prefix_reusable_share"]
               - _trace_block_reuse(300)) < 0.02
    bare = tmp_path / "bare.jsonl"
    bare.write_text('{"index": 0, "input_tokens": 10}\n')
    proc = subprocess.run(goodput_command("advise", "--records", str(bare)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "hash_ids" in proc.stderr and "Traceback" not in proc.stderr


# ---- the worked example live: sidecar in front of the bundled engine -------------------------

@pytest.fixture(scope="module")
def engine():
    port = free_port()
    server = ServerProcess(goodput_command("engine", "serve", "--model", "tiny", "--port", str(port),
                                           "--max-model-len", "4096"),
                           f"http://127.0.0.1:{port}/v1/models", timeout=180, name="engine")
    yield f"http://127.0.0.1:{port}"
    server.stop()


def _chat(client: httpx.Client, url: str, messages: list[dict]) -> dict:
    body = {"model": "tiny", "messages": messages, "max_tokens": 1, "temperature": 0}
    r = client.post(url + "/v1/chat/completions", json=body, headers={"x-tenant": "harbour"})
    r.raise_for_status()
    return r.json()


@pytest.mark.slow
def test_worked_example_through_the_sidecar(sidecars, engine):
    from engine.tokenizer import Tokenizer
    from engine.weights.tiny import tiny_folder

    live = sidecars.start(engine, models=("tiny",))
    ids = [uuid.uuid4().hex for _ in range(40)]
    with httpx.Client(timeout=120) as client:
        as_is = [_chat(client, live.url, worked_example(rid)) for rid in ids]
        advice = httpx.get(live.url + "/advice").json()
        moved = [_chat(client, live.url, worked_example(rid, id_at_end=True)) for rid in ids]
    (group,) = [g for g in advice["groups"] if g["tenant"] == "harbour"]
    assert group["model"] == "tiny" and group["requests"] == 40
    assert group["span_share"] >= 0.95
    # Where the id really sits, in the engine's own tokens of the chat-templated prompt.
    tok = Tokenizer(tiny_folder(progress=lambda _m: None))
    rendered = tok.apply_chat_template(worked_example(ids[0]), add_generation_prompt=True)
    true_offset = len(tok.encode(rendered[:rendered.index(ids[0])], add_special=False))
    assert abs(group["span_offset_tokens"] - true_offset) <= 16, (group, true_offset)
    # The saving is estimated from the engine's own per-request prefill timings.
    assert group["prefill_seconds_per_token"] > 0 and group["ttft_saving_seconds"] > 0
    # Moving the id to the end: the engine's cached tokens per request rise as the advice said.
    def cached(responses):
        return sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in responses[1:]) / (len(responses) - 1)
    gained = cached(moved) - cached(as_is)
    assert gained == pytest.approx(group["cacheable_tokens_per_request"], rel=0.3), (gained, group)
    # Spans carry the cached tokens and the engine's own queue and prefill time.
    attrs = live.finished_spans(80)[-1].attributes
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == moved[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert attrs["goodput.engine.queue_seconds"] >= 0 and attrs["goodput.engine.prefill_seconds"] > 0
    # Metrics and /advice hold no prompt text.
    metrics = httpx.get(live.url + "/metrics").text
    assert live.value("goodput_prompt_volatile_span_requests_total", model="tiny") >= 38
    assert not any(rid in metrics + json.dumps(advice) for rid in ids) and "harbour authority" not in metrics


@pytest.mark.parametrize("hashseed", [None, "0"])
def test_chunk_hashes_are_keyed_per_process(hashseed):
    """The same text hashes differently in two processes, even where PYTHONHASHSEED fixes
    Python's own key (then keyed BLAKE2b with a per-process secret takes over): nothing outside
    the process can confirm a guessed prompt from a hash."""
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if hashseed is not None:
        env["PYTHONHASHSEED"] = hashseed
    code = ("from sidecar.advice import chunk_text, chunk_token_ids; "
            "print(chunk_text('Request id: 42\\nThe same line.\\n').hashes, chunk_token_ids([1, 2, 3]).hashes)")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60).stdout
            for _ in range(2)]
    assert runs[0] and runs[0] != runs[1]


def test_advice_cost_script_times_each_step_on_the_benchmarks_bodies(capsys):
    """scripts/advice_cost.py (the README's hot-loop figures for `requests2k`): it reads the
    benchmark's own 2,048-token bodies, prints one timing per step, and refuses a bad count."""
    script = load_script("advice_cost.py")
    assert script.main(["--number", "20"]) == 0
    out = capsys.readouterr().out
    assert "209 chunks a prompt" in out
    timed = [line.split() for line in out.splitlines()[1:]]
    assert [t[0] for t in timed] == ["json.loads", "advice.render", "PromptWindow.analyse_and_add"]
    assert all(float(t[1]) > 0 and t[2] == "µs" for t in timed)
    with pytest.raises(SystemExit):
        script.main(["--number", "0"])
