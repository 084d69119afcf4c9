import io

import numpy as np
import pytest

from mooncake.tools.common import (Progress, ToolError, format_table, human_bytes, human_count, parse_count,
                                   parse_count_list, percentile, split_choices)


def test_parse_count_accepts_scientific_notation():
    assert parse_count("1e6", "x") == 1_000_000
    assert parse_count(" 3000 ", "x") == 3000
    assert parse_count_list("1e4,1e5, 2.5e6", "x") == [10_000, 100_000, 2_500_000]


@pytest.mark.parametrize("text", ["abc", "0", "-5", "1.5", "inf", "nan"])
def test_parse_count_rejects_bad_values(text):
    with pytest.raises(ToolError):
        parse_count(text, "--capacity-tokens")


def test_parse_count_list_rejects_empty():
    with pytest.raises(ToolError, match="empty"):
        parse_count_list(" , ", "--capacity-tokens")


def test_split_choices_checks_and_dedups():
    assert split_choices("LRU,belady,lru", ["lru", "belady"], "--policy") == ["lru", "belady"]
    with pytest.raises(ToolError, match="unknown 'mru'"):
        split_choices("lru,mru", ["lru"], "--policy")


def test_format_table_aligns_numbers_right_and_text_left():
    out = format_table(["name", "value"], [["a", "1.5"], ["longer", "10.25"]]).splitlines()
    assert out[0] == "name    value"
    assert out[2] == "a         1.5"
    assert out[3] == "longer  10.25"
    assert format_table(["policy"], [["unbounded"]]).splitlines()[0] == "policy"  # text: left-aligned
    assert format_table(["tokens"], [["inf"], ["1e6"]]).splitlines()[2] == "   inf"  # numbers: right-aligned


def test_human_units():
    assert human_bytes(327680) == "320.00 KiB"
    assert human_bytes(100) == "100 B"
    assert human_count(None) == "inf"
    assert human_count(10_000) == "1e4"
    assert human_count(2_500_000) == "2.5e6"
    assert human_count(512) == "512"
    assert human_count(999_936) == "9.99936e5"  # 1953 blocks of 512 tokens, not "1e6"
    assert human_count(1_000_400) != human_count(1_000_000)
    assert human_count(12_345) == "1.2345e4"


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    values = sorted([3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.3])
    assert percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_percentile_of_nothing_is_nan():
    assert np.isnan(percentile([], 50))


def test_progress_prints_one_line_when_not_a_terminal():
    stream = io.StringIO()
    bar = Progress("[job]", 10, stream=stream)
    bar.update(5)
    bar.finish()
    assert stream.getvalue().startswith("[job]  done in ")
    assert stream.getvalue().count("\n") == 1
    quiet = io.StringIO()
    Progress("[job]", 10, enabled=False, stream=quiet).finish()
    assert quiet.getvalue() == ""
