"""What the store client's data-path calls share: the code they return once the store is closed (or before
it is set up), and the guard that lets close wait for the calls in flight (StoreCore._enter / _leave)."""

from __future__ import annotations

import functools

from mooncake.store.master.errors import ErrorCode

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


def all_failed(keys, *_, **__) -> list:
    return [NOT_READY] * len(keys)


def none(*_, **__):
    return None
