"""What the store client's data-path calls share: the code they return once the store is closed (or before
it is set up), the guard that lets close wait for the calls in flight (StoreCore._enter / _leave), and the
check that a call's lists match (``same_len``: logs which lengths differ)."""

from __future__ import annotations

import functools
import logging

from mooncake.store.common.errors import ErrorCode

_log = logging.getLogger("mooncake.store.client")

NOT_READY = int(ErrorCode.INTERNAL_ERROR)  # what calls before setup / after close return


def while_open(closed):
    """Decorator of StoreCore data-path methods: the call runs between _enter and _leave, so close waits for
    it before the engine unmaps the memory it may touch; once close began it returns closed(*args) at once."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(self, *args, **kwargs):
            if not self._enter():
                return closed(*args, **kwargs)
            try:
                return fn(self, *args, **kwargs)
            finally:
                self._leave()
        return run
    return wrap


def same_len(op: str, *lists) -> bool:
    """Whether the lists have one length; when not, logs it for call `op` and returns False."""
    if len({len(x) for x in lists}) == 1:
        return True
    _log.error("%s: list arguments differ in length (%s)", op, ", ".join(str(len(x)) for x in lists))
    return False


def all_failed(keys, *_, **__) -> list:
    return [NOT_READY] * len(keys)


def none(*_, **__):
    return None
