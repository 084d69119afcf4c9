import json
import os
import re
import subprocess
import sys

import pytest

import mooncake
import mooncake.tools
from mooncake.tools.cli import main
from mooncake.tools.testutil import write_trace

ROWS = [{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 500, "input_length": 1500, "output_length": 3, "hash_ids": [0, 1, 2]},
        {"timestamp": 900, "input_length": 700, "output_length": 1, "hash_ids": [0, 3]}]


@pytest.fixture
def trace(tmp_path):
    return write_trace(tmp_path / "tiny_trace.jsonl", ROWS)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_package_layout():
    assert mooncake.tools.__name__ == "mooncake.tools"


@pytest.mark.parametrize("argv", [["--help"], ["kvcache-size", "--help"], ["hitrate", "--help"],
                                  ["replay", "--help"], ["trace-stats", "--help"]])
def test_help(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert "usage: mooncake" in capsys.readouterr().out


def test_kvcache_size_json_and_table(capsys):
    code, out, _ = run(capsys, "kvcache-size", "--model", "llama-3-70b", "--tokens", "1e3", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["bytes_per_token"] == 327_680 and data["request_bytes"] == 327_680_000
    assert data["block_size"] == 512 and data["tokens"] == 1000
    code, out, _ = run(capsys, "kvcache-size", "--model", "deepseek-v3", "--tp", "8", "--dtype", "fp8")
    assert code == 0 and "35,136 B" in out and "per GPU (tp=8)" in out
    code, out, _ = run(capsys, "kvcache-size", "--list-models", "--json")
    assert code == 0 and {"kimi-k2", "qwen3-235b-a22b"} <= {m["model"] for m in json.loads(out)}


def test_hitrate_json_schema(capsys, trace, tmp_path):
    code, out, err = run(capsys, "hitrate", "--trace", trace, "--policy", "lru,unbounded,belady",
                         "--capacity-blocks", "1,4", "--plot", str(tmp_path / "h.png"), "--json")
    assert code == 0
    rows = json.loads(out)
    assert [(r["policy"], r["capacity_tokens"]) for r in rows] == [
        ("lru", 512), ("lru", 2048), ("unbounded", None), ("belady", 512), ("belady", 2048)]
    for r in rows:
        assert {"trace", "policy", "capacity_tokens", "hit_ratio", "capacity_blocks", "scope"} <= set(r)
    assert rows[2]["hit_ratio"] == pytest.approx((1024 + 512) / 3200)  # 2 full blocks, then 1
    assert "done in" in err  # progress on stderr
    assert (tmp_path / "h.png").exists()


def test_hitrate_local_vs_global_table(capsys, trace):
    code, out, _ = run(capsys, "hitrate", "--trace", trace, "--trace", trace, "--merge", "--instances", "2",
                       "--capacity-tokens", "2048", "--quiet")
    assert code == 0
    assert "local x2 (prefix)" in out and "tiny+tiny" in out


def test_replay_json_schema(capsys, trace):
    code, out, err = run(capsys, "replay", "--trace", trace, "--prefill-nodes", "2", "--decode-nodes", "1",
                         "--json", "--quiet")
    assert code == 0 and err == ""
    rows = json.loads(out)
    assert [r["policy"] for r in rows] == ["random", "load-balance", "local-cache-aware", "global-cache-aware"]
    for r in rows:
        assert {"policy", "mean_ttft_s", "p99_ttft_s", "mean_tbt_s", "slo_attainment", "rejected",
                "cache_hit_ratio", "prefill_load", "decode_load"} <= set(r)
        assert r["requests"] == 3 and r["slo_attainment"] == 1.0


def test_replay_table(capsys, trace, tmp_path):
    code, out, _ = run(capsys, "replay", "--trace", trace, "--policy", "global-cache-aware", "--per-instance",
                       "--early-rejection", "--model", "qwen3-8b", "--plot", str(tmp_path / "t.png"), "--quiet")
    assert code == 0
    assert "global-cache-aware" in out and "prefill 0" in out and "decode 7" in out
    assert (tmp_path / "t.png").exists()


def test_trace_stats(capsys, trace):
    code, out, _ = run(capsys, "trace-stats", "--trace", trace, "--json")
    assert code == 0 and json.loads(out)[0]["requests"] == 3


def test_trace_names_read_the_shipped_traces(capsys, monkeypatch):
    monkeypatch.delenv("MOONCAKE_TRACES_DIR", raising=False)
    code, out, err = run(capsys, "trace-stats", "--trace", "conversation", "--trace", "synthetic", "--json")
    assert code == 0, err
    assert [(r["trace"], r["requests"]) for r in json.loads(out)] == [("conversation", 12031), ("synthetic", 3993)]


@pytest.mark.parametrize("argv, message", [
    (["hitrate", "--trace", "/no/such/trace.jsonl"], "no such file"),
    (["hitrate", "--trace", "toolagent"], r"no toolagent_trace\.jsonl\[\.gz\|\.xz\] in .*shipped: conversation"),
    (["hitrate", "--trace", "{bad}", "--capacity-tokens", "0"], "--capacity-tokens: must be > 0"),
    (["hitrate", "--trace", "{bad}"], r"bad\.jsonl:2: not valid JSON"),
    (["hitrate", "--trace", "{good}", "--capacity-tokens", "100"], "less than one 512-token block"),
    (["hitrate", "--trace", "{good}", "--policy", "mru"], "unknown 'mru'"),
    (["hitrate", "--trace", "{good}", "--merge"], "at least two"),
    (["hitrate", "--trace", "{good}", "--instances", "3", "--policy", "belady"], "belady cannot be combined"),
    (["kvcache-size", "--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["kvcache-size", "--model", "llama-3-70b", "--tp", "3"], "does not divide"),
    (["kvcache-size", "--config", "/no/such/config.json"], "No such file"),
    (["replay", "--trace", "{good}", "--prefill-nodes", "0"], "must be > 0"),
    (["replay", "--trace", "{good}", "--model", "nope"], "unknown model"),
    (["replay", "--trace", "{good}", "--prefill-coeffs", "1e-4"], "two comma-separated numbers"),
    (["replay", "--trace", "{good}", "--node-cache-tokens", "10"], "less than one 512-token block"),
    (["trace-stats", "--trace", "{bad}"], "not valid JSON"),
    (["trace-stats", "--trace", "{partial}"], r"partial\.jsonl:2: 'output_length' must be a non-negative integer"),
    (["hitrate", "--trace", "{partial}"], r"partial\.jsonl:2: 'output_length'"),
    (["hitrate", "--trace", "{good}", "--capacity-blocks", "0"], "--capacity-blocks: must be > 0"),
    # Checked before any simulation runs (no "done in" progress line: see the assertion below).
    (["hitrate", "--trace", "{good}", "--capacity-blocks", "2", "--instances", "3"], "cannot be split over 3"),
    (["hitrate", "--trace", "{good}", "--plot", "{tmp}/no-such-dir/x.png"], "cannot write plot .*no folder"),
    (["replay", "--trace", "{good}", "--plot", "{tmp}/x.bogus"], "unknown image format 'bogus'"),
    (["replay", "--trace", "{good}", "--decode-step", "0,0"], "decode_step_s must be > 0"),
])
def test_bad_input_exits_2_with_a_message(capsys, tmp_path, argv, message):
    good = write_trace(tmp_path / "good.jsonl", ROWS)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n{oops\n")
    partial = tmp_path / "partial.jsonl"  # second line lacks output_length
    partial.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({k: v for k, v in ROWS[1].items()
                                                                if k != "output_length"}) + "\n")
    subst = {"{good}": good, "{bad}": str(bad), "{partial}": str(partial), "{tmp}": str(tmp_path)}
    for key, value in subst.items():
        argv = [a.replace(key, value) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert "error:" in err and "Traceback" not in err and "done in" not in err
    assert re.search(message, err), err


def test_plot_without_matplotlib_is_a_clear_error(capsys, trace, monkeypatch, tmp_path):
    # matplotlib is an optional extra of the wheel; `import matplotlib` fails when it is absent.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    for argv in (["hitrate", "--trace", trace, "--capacity-blocks", "4"], ["replay", "--trace", trace]):
        code, out, err = run(capsys, *argv, "--plot", str(tmp_path / "p.png"))
        assert code == 2 and out == "" and "done in" not in err
        assert "--plot needs matplotlib" in err and "Traceback" not in err


def test_tables_align_text_left(capsys, trace):
    code, out, _ = run(capsys, "hitrate", "--trace", trace, "--policy", "unbounded", "--quiet")
    header, _, row = out.splitlines()
    assert code == 0 and header.index("policy") == row.index("unbounded")  # a text column, even if 'unbounded'


@pytest.mark.parametrize("argv", [["hitrate"], ["kvcache-size", "--bogus"], ["nonsense"], []])
def test_bad_options_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_module_entry_point_exit_status(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    proc = subprocess.run([sys.executable, "-m", "mooncake.tools", "hitrate", "--trace", str(bad)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "bad.jsonl:1: not valid JSON" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "mooncake.tools", "kvcache-size", "--model", "llama-3-70b",
                           "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["bytes_per_token"] == 327_680
