"""The one reader per trace format, on the real shared traces and on broken files."""

from __future__ import annotations

import json

import pytest

import tracefiles
from tracefiles import TraceError
from tests.support import TRACES

AZURE = TRACES / "azure2023_code.csv"
MOONCAKE = TRACES / "mooncake_conversation.jsonl"
SERVEGEN = TRACES / "servegen_language_m-large"
needs_traces = pytest.mark.skipif(not AZURE.exists(), reason="needs ../shared/traces")


@needs_traces
def test_azure_exact_rows():
    reqs = tracefiles.read_azure(AZURE)
    # traces/README.md: 8,819 requests; the file's first rows are 18:17:03.9799600,4808,10 and
    # 18:17:04.0319600,3180,8 and its last 19:14:19.9280160,549,173: 52 ms, then 57 min 15.948056 s
    # after the first, to the 100 ns the file records.
    assert len(reqs) == 8819
    assert (reqs[0].arrival_s, reqs[0].input_tokens, reqs[0].output_tokens) == (0.0, 4808, 10)
    assert reqs[1].arrival_s == pytest.approx(0.052, abs=1e-9) and (reqs[1].input_tokens, reqs[1].output_tokens) == (3180, 8)
    assert reqs[-1].arrival_s == pytest.approx(57 * 60 + 15.948056, abs=1e-9)
    assert (reqs[-1].input_tokens, reqs[-1].output_tokens) == (549, 173)
    assert max(r.input_tokens for r in reqs) == 7437 and max(r.output_tokens for r in reqs) == 1899


@needs_traces
def test_mooncake_exact_records():
    reqs = tracefiles.read_mooncake(MOONCAKE)
    first = json.loads(MOONCAKE.open().readline())
    # traces/README.md: 12,031 requests over 58.9 min; the last line's timestamp is 3,536,999 ms.
    assert len(reqs) == 12031
    assert (reqs[0].arrival_s, reqs[0].input_tokens, reqs[0].output_tokens) == (0.0, 6758, 500)
    assert reqs[0].hash_ids == tuple(first["hash_ids"]) == tuple(range(14))
    assert reqs[-1].arrival_s == 3536.999 and reqs[-1].input_tokens == 20774
    assert all(len(r.hash_ids) == -(-r.input_tokens // tracefiles.MOONCAKE_BLOCK_TOKENS) for r in reqs)


@needs_traces
def test_servegen_exact_windows():
    clients = tracefiles.read_servegen(SERVEGEN)
    # 162 clients, 14 days of 10-minute windows each, in client-number order (not 0, 1, 10, 100...).
    assert [c.client for c in clients] == list(range(162))
    assert all(len(c) == 2016 for c in clients)
    # chunk-7-trace.csv line 3: 1200,16.411666666666665,1.0187597125112273,Gamma,0.9635105560183332,0.06322772136898533
    c7 = clients[7]
    assert (c7.window_start_s[2], c7.rate[2], c7.cv[2], c7.distribution[2], c7.shape[2], c7.scale[2]) == \
        (1200.0, 16.411666666666665, 1.0187597125112273, "Gamma", 0.9635105560183332, 0.06322772136898533)
    # chunk-0-trace.csv line 2: 600,0,0,,0,0 (no traffic: empty distribution).
    assert (clients[0].rate[1], clients[0].distribution[1]) == (0.0, "")


@needs_traces
def test_detect_format_of_each_shared_trace():
    assert [tracefiles.detect_format(p) for p in (AZURE, MOONCAKE, SERVEGEN)] == ["azure", "mooncake", "servegen"]
    assert tracefiles.read_requests(MOONCAKE)[0].hash_ids == tuple(range(14))


def test_burstgpt_keeps_failed_requests(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n2,GPT-4,1087,0,1087,Conversation log\n")
    reqs = tracefiles.read_requests(path)
    # Sorted and re-based; the failed request (0 response tokens) kept with 1.
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in reqs] == [(0.0, 1087, 1), (3.0, 472, 18)]


@pytest.mark.parametrize("name, text, where, what", [
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,10,2\n2023-11-16 18:17:04,ten,2\n",
     "a.csv:3", "ten"),
    ("b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16T18:17:03,10,2\n", "b.csv:2", "does not match format"),
    ("c.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,-2\n", "c.csv:2", "negative"),
    ("d.csv", "TIMESTAMP,ContextTokens,Tokens\n", "d.csv:1", "lacks GeneratedTokens"),
    ("e.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5}\n',
     "e.jsonl:2", "no 'output_length'"),
    ("f.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n\n{"timestamp": 1,\n', "f.jsonl:3", "Expecting"),
    ("g.csv", "Timestamp,Model,Request tokens,Response tokens\n1,m,x,2\n", "g.csv:2", "BurstGPT"),
])
def test_bad_rows_name_the_file_and_line(tmp_path, name, text, where, what):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=where) as err:
        tracefiles.read_requests(path)
    assert what in str(err.value)
    assert isinstance(err.value, ValueError)


def test_bad_servegen_row_names_the_file_and_line(tmp_path):
    (tmp_path / "chunk-0-trace.csv").write_text("0,1.5,1.0,Gamma,1.0,0.6\n600,2,1.0,Pareto,1.0,0.5\n")
    with pytest.raises(TraceError, match=r"chunk-0-trace.csv:2: .*Pareto"):
        tracefiles.read_servegen(tmp_path)
    (tmp_path / "chunk-0-trace.csv").write_text("0,1.5,1.0\n")
    with pytest.raises(TraceError, match=r"chunk-0-trace.csv:1: .*3 columns, expected 6"):
        tracefiles.read_servegen(tmp_path)


def test_missing_empty_and_unknown_traces(tmp_path):
    with pytest.raises(TraceError, match="no such trace"):
        tracefiles.detect_format(tmp_path / "missing.csv")
    with pytest.raises(TraceError, match="no chunk-<client>-trace.csv"):
        tracefiles.read_servegen(tmp_path)
    empty = tmp_path / "empty.csv"
    empty.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(TraceError, match="empty.csv: the trace holds no requests"):
        tracefiles.read_azure(empty)
    other = tmp_path / "other.csv"
    other.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="other.csv: unknown trace format"):
        tracefiles.read_requests(other)
    with pytest.raises(TraceError, match="not a per-request trace format"):
        tracefiles.read_requests(other, fmt="servegen")


@needs_traces
def test_every_consumer_sees_the_same_requests():
    """The load generator, the backtests and the simulator read the Azure trace through the one
    reader, so they agree request for request."""
    from forecaster.simulate.traces import read_azure_csv
    from forecaster.traces import read_azure
    from sidecar.loadgen.traces import read_trace

    ref = tracefiles.read_azure(AZURE)
    load = read_trace(AZURE)
    back = read_azure(AZURE)
    sim = read_azure_csv(AZURE)
    assert [(r.arrival, r.input_tokens, r.output_tokens) for r in load] == \
        [(r.t, r.input_tokens, r.output_tokens) for r in back] == \
        [(r.arrival_s, r.input_tokens, r.output_tokens) for r in ref]
    assert sim.arrival_s.tolist() == [r.arrival_s for r in ref]
    assert sim.prompt_tokens.tolist() == [r.input_tokens for r in ref]
