"""Key patterns of the regex APIs (GetReplicaListByRegex, RemoveByRegex): RE2 syntax, linear-time matching.

A pattern is searched for anywhere in a key (``re.search`` semantics) with Google's RE2 (``google-re2``):
matching costs O(len(key) * len(pattern)) at worst, whatever the pattern, so no pattern can backtrack
catastrophically (``(a+)+$`` costs the same as ``a+$``). RE2 has no backreferences or look-around; such a
pattern, a pattern longer than MAX_PATTERN_BYTES (UTF-8) or one whose compiled form needs more than
MAX_PROGRAM_BYTES is refused with a ValueError naming the reason.

Threading: a KeyPattern is immutable and may be used from any thread; ``search`` releases the GIL while RE2
runs.
"""

from __future__ import annotations

import re2
from re2 import _re2  # the binding itself: no module-level cache of compiled patterns, no match objects

MAX_PATTERN_BYTES = 4096
MAX_PROGRAM_BYTES = 8 << 20  # RE2's max_mem: the compiled program and its DFA caches

_UNANCHORED = _re2.RE2.Anchor.UNANCHORED


def _options() -> re2.Options:
    o = re2.Options()
    o.max_mem = MAX_PROGRAM_BYTES
    o.never_capture = True  # only "does it match" is asked: no submatch bookkeeping
    o.log_errors = False  # a bad pattern is the caller's error, reported by the ValueError
    return o


class KeyPattern:
    """A compiled key pattern; ``search(key)`` is True when the pattern occurs in `key`."""

    __slots__ = ("pattern", "_rx")

    def __init__(self, pattern: str) -> None:
        if not isinstance(pattern, str):
            raise ValueError(f"the pattern must be a str, got {type(pattern).__name__}")
        try:
            encoded = pattern.encode("utf-8")
        except UnicodeError:
            raise ValueError("the pattern is not valid Unicode text") from None
        if len(encoded) > MAX_PATTERN_BYTES:
            raise ValueError(f"the pattern has {len(encoded)} bytes; at most {MAX_PATTERN_BYTES} are accepted")
        rx = _re2.RE2(encoded, _options())
        if not rx.ok():
            raise ValueError(f"not a valid RE2 pattern: {rx.error().decode('utf-8', 'replace')}")
        self.pattern = pattern
        self._rx = rx

    def search(self, key: str) -> bool:
        b = key.encode("utf-8", "surrogatepass")
        return self._rx.Match(_UNANCHORED, b, 0, len(b))[0][0] >= 0
