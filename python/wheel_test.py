"""The built wheel installs with pip into a clean venv and works there (no Bazel, no source tree)."""

import glob
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)  # the source tree, or the runfiles tree under Bazel (READMEs are data)
WHEEL = glob.glob(os.path.join(HERE, "mooncake_transfer_engine_non_cuda-*.whl"))
MAX_WHEEL_MIB = 8  # a budget: today ~1.5 MiB (the gzip traces ~1.1 MiB of it); catches stray data or debug builds


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    assert len(WHEEL) == 1, WHEEL
    root = tmp_path_factory.mktemp("venv")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(root)], check=True, timeout=120)
    py = str(root / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", WHEEL[0]], check=True, timeout=300)
    # numpy (a declared dependency) and matplotlib (the plot extra): offline, borrow the ones this test runs with,
    # after the venv's own site-packages so the installed mooncake still wins.
    site = os.path.dirname(os.path.dirname(__import__("numpy").__file__))
    venv_site = sysconfig.get_path("purelib", vars={"base": str(root), "platbase": str(root)})
    with open(os.path.join(venv_site, "deps.pth"), "w") as f:
        f.write(site + "\n")
    return root


def run(venv, args, cwd=None, **kw):
    """Runs a command of the venv as a user would: no source tree on the path, no traces folder configured."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "MOONCAKE_TRACES_DIR")}
    env["MPLCONFIGDIR"] = str(venv / "mplconfig")  # matplotlib's cache, somewhere writable
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=str(cwd or venv), env=env, **kw)


def test_wheel_contents():
    names = zipfile.ZipFile(WHEEL[0]).namelist()
    assert any(n.startswith("mooncake/_native.") and n.endswith(".so") for n in names)
    assert "mooncake/tools/cli.py" in names
    assert "mooncake/store/master/cli.py" in names
    assert "mooncake/ep/buffer.py" in names and "mooncake/mooncake_ep_buffer.py" in names
    assert "mooncake/pg/__init__.py" in names and "mooncake/async_store.py" in names
    assert "mooncake/store/client/store.py" in names
    assert "mooncake/store/proto/mooncake_master_pb2_grpc.py" in names
    assert not any(n.endswith("_test.py") for n in names)
    for f in ("conversation_trace.jsonl.gz", "synthetic_trace.jsonl.gz", "README.md", "LICENSE"):
        assert "mooncake/tools/traces/" + f in names
    assert not any(n.endswith("testutil.py") for n in names)
    assert os.path.getsize(WHEEL[0]) < MAX_WHEEL_MIB << 20, os.path.getsize(WHEEL[0])
    entry = zipfile.ZipFile(WHEEL[0]).read(
        next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for script in ("transfer_engine_bench", "mooncake_http_metadata_server", "mooncake ", "mooncake_master",
                   "mooncake_client", "transfer_engine_topology_dump"):
        assert script in entry


def test_engine_works_from_the_installed_wheel(venv):
    code = textwrap.dedent("""
        import mooncake, mooncake.engine
        from mooncake.engine import TransferEngine
        assert 'site-packages' in mooncake.__file__, mooncake.__file__
        a, b = TransferEngine(), TransferEngine()
        assert a.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0
        assert b.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0
        src, dst = a.allocate_managed_buffer(1 << 20), b.allocate_managed_buffer(1 << 20)
        data = bytes(range(256)) * 4096
        a.write_bytes_to_buffer(src, data, len(data))
        assert a.transfer_sync_write(b.get_local_segment_name(), src, dst, len(data)) == 0
        assert b.read_bytes_from_buffer(dst, len(data)) == data
        print('ok')
    """)
    out = run(venv, [str(venv / "bin" / "python"), "-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_console_scripts(venv):
    out = run(venv, [str(venv / "bin" / "mooncake_http_metadata_server"), "--help"])
    assert out.returncode == 0 and "--port" in out.stdout, out.stderr
    out = run(venv, [str(venv / "bin" / "transfer_engine_bench"), "--help"])
    assert out.returncode == 0 and "--mode" in out.stdout, out.stderr
    out = run(venv, [str(venv / "bin" / "mooncake"), "kvcache-size", "--model", "llama-3-70b", "--json"])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["bytes_per_token"] == 327680  # Llama-3-70B, bf16: 320 KiB per token
    out = run(venv, [str(venv / "bin" / "mooncake_master"), "--help"])
    assert out.returncode == 0 and "--port" in out.stdout, out.stderr


# ---- the planning tools' README examples, run from the installed wheel ----------------------------------------------

def readme_examples():
    """(where, argv, documented output lines) of every `mooncake` example: the `$ mooncake ...` lines of
    tools/README.md with the output shown under each, and the commands of the root README's "Planning tools"
    section (no output shown; `# ...` comments dropped)."""
    examples = []
    with open(os.path.join(REPO, "tools", "README.md"), encoding="utf-8") as f:
        output = None  # the documented output of the last command of the current code block
        for lineno, line in enumerate(f.read().splitlines(), 1):
            if line.startswith("```"):
                output = None
            elif line.startswith("$ mooncake "):
                output = []
                examples.append((f"tools/README.md:{lineno}", shlex.split(line[2:]), output))
            elif output is not None:
                output.append(line)
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"^## Planning tools\n(.*?)^## ", text, re.M | re.S)
    assert section, "README.md has no 'Planning tools' section"
    first = text[:section.start(1)].count("\n") + 1
    for offset, line in enumerate(section.group(1).splitlines()):
        if line.startswith("mooncake "):
            examples.append((f"README.md:{first + offset}", shlex.split(line, comments=True), []))
    return examples


EXAMPLES = readme_examples()


def test_both_readmes_show_every_subcommand():
    for where in ("tools/README.md", "README.md"):
        shown = {argv[1] for w, argv, _ in EXAMPLES if w.split(":")[0] == where}
        assert shown == {"kvcache-size", "hitrate", "replay", "trace-stats"}, (where, shown)
    assert all(out for w, _, out in EXAMPLES if w.startswith("tools/")), "a tools/README.md example shows no output"


def shows(documented: str, line: str) -> bool:
    """Whether an output line is the documented one, cell for cell (whitespace-separated); a `...` cell in the
    documentation stands for one or more elided cells."""
    pattern = " ".join(r"\S+(?: \S+)*" if cell == "..." else re.escape(cell) for cell in documented.split())
    return re.fullmatch(pattern, " ".join(line.split())) is not None


def test_shows_matches_cells_and_elisions():
    assert shows("a  b   c", "a b c") and not shows("a b", "a b c") and not shows("a b c", "a b c2")
    assert shows("a ... d", "a b c d") and not shows("a ... d", "a d") and not shows("a ... d", "a b c d e")
    assert shows("a ...", "a b c") and shows("a ... c ... f", "a b c d e f") and not shows("a ...", "a")


@pytest.mark.parametrize("where, argv, documented", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_readme_example_runs_from_the_installed_wheel(venv, tmp_path, where, argv, documented):
    command = shlex.join(argv)
    assert argv[0] == "mooncake", command
    out = run(venv, [str(venv / "bin" / "mooncake")] + argv[1:], cwd=tmp_path)
    assert out.returncode == 0, f"{where}: {command}\n{out.stderr}"
    assert "Traceback" not in out.stderr
    # The documented lines appear in the output, in order (the output may have more: separators, extra rows).
    got = iter(out.stdout.splitlines())
    for line in documented:
        assert any(shows(line, g) for g in got), f"{where}: {command}: no output line shows\n{line}\n{out.stdout}"
    if "--plot" in argv:
        with open(tmp_path / argv[argv.index("--plot") + 1], "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_named_traces_are_the_installed_copies(venv):
    code = textwrap.dedent("""
        from mooncake.tools.trace import load_trace, resolve_trace_path
        print(resolve_trace_path('synthetic'))
        print(len(load_trace('conversation')))
    """)
    out = run(venv, [str(venv / "bin" / "python"), "-c", code])
    assert out.returncode == 0, out.stderr
    path, requests = out.stdout.split()
    assert path.startswith(str(venv)) and path.endswith("mooncake/tools/traces/synthetic_trace.jsonl.gz"), path
    assert requests == "12031"
