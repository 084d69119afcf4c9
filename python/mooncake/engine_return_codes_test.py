"""The README's table of Transfer Engine return codes matches the code (transfer_engine/api/status.h/.cc)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).absolute().parents[2]  # the runfiles' (or checkout's) repository root


def _enum():
    """{code: NAME} from ErrorCodeName() in status.cc and the enum in status.h."""
    header = (ROOT / "transfer_engine/api/status.h").read_text()
    values = {m[0]: int(m[1]) for m in re.findall(r"^\s*k(\w+) = (-?\d+),", header, re.M)}
    source = (ROOT / "transfer_engine/api/status.cc").read_text()
    names = dict(re.findall(r'case ErrorCode::k(\w+): return "(\w+)";', source))
    assert values and set(values) == set(names), (values, names)
    return {values[k]: names[k] for k in values if values[k] != 0}


def _readme_section():
    text = (ROOT / "README.md").read_text()
    start = text.index("### Return codes")
    return text[start:text.index("\n## ", start)]


def test_the_code_table_lists_every_code_with_its_name():
    section = _readme_section()
    table = section[section.index("| Code | Name |"):]
    documented = {int(code): name for code, name in re.findall(r"\|\s*(-\d+)\s*\|\s*([A-Z_]+)\s*(?=\|)", table)}
    assert documented == _enum()


def test_every_code_a_call_is_documented_to_return_exists():
    section = _readme_section()
    calls = section[section.index("| Call |"):section.index("| Code | Name |")]
    mentioned = {int(c) for c in re.findall(r"`(-\d+)`", calls)}
    codes = _enum()
    # -2 is also transfer_check_status's "timed out", as in Mooncake.
    assert mentioned <= set(codes), mentioned - set(codes)
    assert {-1, -3, -7, -400, -402, -403} <= mentioned
