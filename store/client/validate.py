"""Argument checks of the store's public Python API, in one place.

Contract. A public method decorated with ``@typed(param=kind, ...)`` raises ``TypeError`` (naming the method,
the parameter, the element for a list, and the type received) when an argument has the wrong Python type, as
Mooncake's bindings do. The check runs before the method body, so it raises whether or not the store is set
up and changes no state: the store stays usable. Arguments of the right type but a bad value (an empty key, a
key longer than MAX_KEY_BYTES, lists of different lengths, memory that is not registered) are not type
errors: the method answers them with its usual error code (INVALID_PARAMS, -600) and a log line.

Accepted types (Mooncake's bindings, and what vLLM / SGLang / LMCache pass):
  KEY       str (subclasses too). bytes are refused: keys are text (UTF-8 on the wire).
  KEYS      a list, tuple, range-like sequence or 1-D numpy array of KEY; given to the method as a list.
  VALUE     any object with the buffer protocol: bytes, bytearray, memoryview, numpy arrays, array.array,
            mmap, ... (a non-contiguous one is a bad value: -600).
  UINT      an int or an object with ``__index__`` (numpy integers) in [0, 2**64): addresses and sizes
            (Mooncake's uintptr_t / size_t). bool and float are refused. Given to the method as an int.
  INT       like UINT, any sign (TP ranks, split dims, range offsets).
  FLAG      bool, numpy bool, or the ints 0 / 1. Given to the method as a bool.
  CONFIG    a ReplicateConfig, or None (the default config).
  SIZE      a setup size: UINT, or a string like "16MB".
  TENSOR    a torch.Tensor (the check never imports torch).
  seq(kind) a sequence (as KEYS) of `kind`, e.g. seq(UINT) for buffer pointers, seq(seq(UINT)) for
            per-key buffer lists; optional(kind): None or `kind`; enum_of(E): a member of IntEnum E or its
            value; either(k1, k2, expected=...): the first kind that accepts the value.

``key_error(key)`` is the value check of a key (the limit, MAX_KEY_BYTES = 64 KiB of UTF-8, is the master's).
Threading: everything here is pure and thread-safe.
"""

from __future__ import annotations

import functools
import inspect
import operator
import sys

from mooncake.store.common.protocol import MAX_KEY_BYTES

__all__ = ["CONFIG", "FLAG", "INT", "KEY", "KEYS", "MAX_KEY_BYTES", "SIZE", "STR", "TENSOR", "UINT", "VALUE",
           "Wrong", "check", "either", "enum_of", "key_error", "optional", "seq", "typed"]

_U64 = 1 << 64
_NOT_SEQUENCES = (str, bytes, bytearray, memoryview, dict, set, frozenset)


class Wrong(Exception):
    """Raised by a kind: `expected` says what was wanted, `path` where (e.g. "[3]" in a list)."""

    def __init__(self, expected: str, got, path: str = "") -> None:
        super().__init__(expected)
        self.expected = expected
        self.got = got
        self.path = path


def _type_name(v) -> str:
    return "None" if v is None else type(v).__name__


def check(kind, value, label: str):
    """kind(value), or TypeError "<label> must be <expected>, got <type>" (label: e.g. "put(): key")."""
    try:
        return kind(value)
    except Wrong as e:
        raise TypeError(f"{label}{e.path} must be {e.expected}, got {_type_name(e.got)}") from None


# -- kinds: value -> normalised value, or raise Wrong --------------------------------------------------------------
def KEY(v):
    if isinstance(v, str):
        return v
    raise Wrong("a str", v)


STR = KEY  # any other text argument (regex, segment names, task ids)


def VALUE(v):
    if type(v) is bytes or type(v) is bytearray or type(v) is memoryview:
        return v
    try:
        memoryview(v).release()
    except TypeError:
        raise Wrong("a bytes-like object (bytes, bytearray, memoryview, numpy array, ...)", v) from None
    return v


def _index(v, expected: str) -> int:
    if type(v) is int:
        return v
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        raise Wrong(expected, v)
    if "numpy" in sys.modules and isinstance(v, sys.modules["numpy"].bool_):
        raise Wrong(expected, v)
    return operator.index(v)


def UINT(v):
    n = _index(v, "an int in [0, 2**64)")
    if 0 <= n < _U64:
        return n
    raise Wrong("an int in [0, 2**64)", v)


def INT(v):
    return _index(v, "an int")


def FLAG(v):
    if v is True or v is False:
        return v
    if type(v) is int and v in (0, 1):
        return bool(v)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, np.bool_):
        return bool(v)
    raise Wrong("a bool", v)


def SIZE(v):
    """A setup size: an int in [0, 2**64) or a string like "16MB" (parsed by config.parse_size)."""
    if isinstance(v, (str, float)) and not isinstance(v, bool):
        return v
    try:
        return UINT(v)
    except Wrong:
        raise Wrong("an int or a size string like '16MB'", v) from None


_CONFIG_TYPE: list = []  # [ReplicateConfig], imported on first use (config imports this module)


def CONFIG(v):
    if v is None:
        return v
    if not _CONFIG_TYPE:
        from mooncake.store.client.config import ReplicateConfig
        _CONFIG_TYPE.append(ReplicateConfig)
    if isinstance(v, _CONFIG_TYPE[0]):
        return v
    raise Wrong("a ReplicateConfig or None", v)


def TENSOR(v):
    torch = sys.modules.get("torch")  # not loaded: no tensor can exist, and the check need not load it
    if torch is not None and isinstance(v, torch.Tensor):
        return v
    raise Wrong("a torch.Tensor", v)


def _items(v, what: str) -> list:
    if type(v) is list:
        return v
    if type(v) is tuple:
        return list(v)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, np.ndarray):
        if v.ndim == 1:
            return v.tolist()
        raise Wrong(f"a list of {what}", v)
    if isinstance(v, _NOT_SEQUENCES) or not (hasattr(v, "__len__") and hasattr(v, "__getitem__")):
        raise Wrong(f"a list of {what}", v)
    try:
        return list(v)
    except TypeError:
        raise Wrong(f"a list of {what}", v) from None


_WHAT = {KEY: "str", VALUE: "bytes-like objects", UINT: "ints in [0, 2**64)", INT: "ints",
         FLAG: "bools", TENSOR: "torch.Tensor"}
_PLAIN = {KEY: str, UINT: int, INT: int}  # element types that need no per-element work


def seq(kind):
    """The kind "a sequence of `kind`" (normalised to a list of normalised elements)."""
    what = _WHAT.get(kind, "lists")
    plain = _PLAIN.get(kind)

    def check_seq(v):
        items = _items(v, what)
        if plain is not None and set(map(type, items)) <= {plain}:
            if kind is not UINT or not items or (min(items) >= 0 and max(items) < _U64):
                return items
        out = None
        for i, x in enumerate(items):
            try:
                y = kind(x)
            except Wrong as e:
                raise Wrong(e.expected, e.got, f"[{i}]{e.path}") from None
            if y is not x:
                if out is None:
                    out = list(items)
                out[i] = y
        return items if out is None else out
    _WHAT[check_seq] = f"lists of {what}"
    return check_seq


KEYS = seq(KEY)


def optional(kind):
    """The kind "None or `kind`"."""
    def check_optional(v):
        if v is None:
            return None
        try:
            return kind(v)
        except Wrong as e:
            raise Wrong(f"None or {e.expected}", e.got, e.path) from None
    return check_optional


def enum_of(cls):
    """The kind "a member of IntEnum `cls`, or its int value"."""
    expected = f"a {cls.__name__} ({', '.join(m.name for m in cls)})"

    def check_enum(v):
        if isinstance(v, cls):
            return v
        try:
            return cls(_index(v, expected))
        except ValueError:
            raise Wrong(expected, v) from None
    return check_enum


def either(*kinds, expected: str):
    """The kind "whatever the first of `kinds` that accepts it makes of it"."""
    def check_either(v):
        for kind in kinds:
            try:
                return kind(v)
            except Wrong:
                pass
        raise Wrong(expected, v)
    return check_either


def key_error(key) -> str | None:
    """Why `key` is not a valid key (a value check: empty, or over MAX_KEY_BYTES of UTF-8), or None."""
    if not isinstance(key, str):
        return f"key must be a str, got {_type_name(key)}"
    if not key:
        return "key must not be empty"
    if len(key) > MAX_KEY_BYTES // 4 and len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        return f"key longer than {MAX_KEY_BYTES} bytes (UTF-8)"
    return None


# -- the decorator -------------------------------------------------------------------------------------------------
def typed(**kinds):
    """Checks (and normalises) the named parameters of a method before it runs; see the module docstring.
    A parameter left at its default is not checked. ``fn.api_kinds`` lists the checked parameters."""

    def wrap(fn):
        params = list(inspect.signature(fn).parameters.values())[1:]  # without self
        by_name = {p.name: (i, p) for i, p in enumerate(params)}
        unknown = set(kinds) - set(by_name)
        if unknown:
            raise AssertionError(f"typed({fn.__name__}): no parameter(s) {sorted(unknown)}")
        plan = []  # (position or None, keyword name or None, star, kind, label)
        for name, kind in kinds.items():
            i, p = by_name[name]
            positional = p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
            keyword = p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            plan.append((i if positional else None, name if keyword else None, p.kind == p.VAR_POSITIONAL, kind,
                         f"{fn.__name__}(): {name}"))

        @functools.wraps(fn)
        def checked(self, *args, **kwargs):
            new_args = None
            for pos, kw, star, kind, label in plan:
                if star:
                    for j in range(pos, len(args)):
                        y = check(kind, args[j], f"{label}[{j - pos}]")
                        if y is not args[j]:
                            new_args = new_args or list(args)
                            new_args[j] = y
                elif pos is not None and pos < len(args):
                    y = check(kind, args[pos], label)
                    if y is not args[pos]:
                        new_args = new_args or list(args)
                        new_args[pos] = y
                elif kw is not None and kw in kwargs:
                    kwargs[kw] = check(kind, kwargs[kw], label)
            return fn(self, *(args if new_args is None else new_args), **kwargs)

        checked.api_kinds = dict(kinds)
        return checked
    return wrap
