"""ep/peers.py on real parts: two Transfer Engines in this process trade records through their mailboxes, and a
TCPStore hosted by a child process (killed to play a store whose host is gone) serves the polls."""

import ctypes
import datetime
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as dist

from mooncake.engine import TransferEngine
from mooncake.ep import peers

_SERVER = """
import sys, time, datetime
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
print(s.port, flush=True)
time.sleep(120)
"""


@pytest.fixture
def store():
    """(client of a TCPStore hosted by a child process, the child); the child is killed at the end."""
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        client = dist.TCPStore("127.0.0.1", port, 1, False, timeout=datetime.timedelta(seconds=10))
        yield client, server
    finally:
        server.kill()
        server.wait()


def _kill(server):
    server.kill()
    server.wait()


@pytest.fixture(scope="module")
def engines():
    made = []
    for _ in range(2):
        e = TransferEngine()
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        made.append(e)
    return made


def _mailboxes(engines):
    boxes = [peers.Mailbox(e, 2, r) for r, e in enumerate(engines)]
    intro = [{"segment": e.get_local_segment_name(), "mailbox": b.base} for e, b in zip(engines, boxes)]
    return boxes, intro


def _record(engine, base):
    return {"segment": engine.get_local_segment_name(), "base": base, "shape": [16, 256, 8]}


def test_poll_store_returns_what_came_by_the_deadline(store):
    client, _ = store
    client.set("k/0", "[1]")
    t0 = time.monotonic()
    got = peers.poll_store(client, {0: "k/0", 1: "k/1"}, time.monotonic() + 0.5)
    assert got == {0: [1]}
    assert 0.5 <= time.monotonic() - t0 < 3


def test_poll_store_rereads_a_refused_value(store):
    client, _ = store
    client.set("k/0", '{"shape": null}')
    later = threading.Timer(0.2, lambda: client.set("k/0", '{"shape": [1]}'))
    later.start()
    try:
        got = peers.poll_store(client, {0: "k/0"}, time.monotonic() + 10, accept=lambda v: v["shape"] is not None)
    finally:
        later.join()
    assert got == {0: {"shape": [1]}}


def test_poll_store_raises_with_what_it_read_when_the_store_is_gone(store):
    client, server = store
    client.set("k/0", "0")
    _kill(server)
    with pytest.raises(peers.StoreUnreachable) as info:
        peers.poll_store(client, {0: "k/0"}, time.monotonic() + 10)
    assert info.value.records == {} and "does not answer" in str(info.value)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError):
        peers.poll_store(client, {1: "k/1"}, time.monotonic() + 10)
    assert time.monotonic() - t0 < 3


def test_introduce_without_a_store_is_a_clear_error(store):
    client, server = store
    _kill(server)
    with pytest.raises(RuntimeError, match="cannot introduce rank 1"):
        peers.introduce(client, "p", 1, 2, {"segment": "s", "mailbox": 1}, time.monotonic() + 10)


def test_introduce_returns_the_ranks_that_came_in_time(store):
    client, _ = store
    client.set("p/hello/0", '{"segment": "s0", "mailbox": 7}')
    client.set("p/ack/0", "1")
    got = peers.introduce(client, "p", 1, 3, {"segment": "s1", "mailbox": 8}, time.monotonic() + 0.5)
    assert got == {0: {"segment": "s0", "mailbox": 7}, 1: {"segment": "s1", "mailbox": 8}}  # rank 2 never came
    assert client.get("p/ack/1") == b"1"


def test_mailboxes_trade_records_within_the_deadline(engines):
    (a, b), intro = _mailboxes(engines)
    t0 = time.monotonic()
    got, failed = b.exchange(_record(engines[1], 11), {0: intro[0]}, time.monotonic() + 0.3)
    assert got == {} and not failed  # rank 0 has not written yet: b gave up at its deadline
    assert 0.3 <= time.monotonic() - t0 < 2
    got, failed = a.exchange(_record(engines[0], 10), {1: intro[1]}, time.monotonic() + 5)
    assert got == {1: _record(engines[1], 11)} and not failed  # left there before: no wait
    assert b._read(0) == _record(engines[0], 10)


def test_a_peer_that_cannot_be_written_is_reported_at_once(engines):
    (a, _), _ = _mailboxes(engines)
    t0 = time.monotonic()
    got, failed = a.exchange(_record(engines[0], 1), {1: {"segment": "127.0.0.1:1", "mailbox": 4096}},
                             time.monotonic() + 10)
    assert got == {} and failed == {1}
    assert time.monotonic() - t0 < 5


def test_an_oversized_record_is_refused_before_anything_is_written(engines):
    (a, b), intro = _mailboxes(engines)
    big = {**_record(engines[0], 1), "pad": "x" * peers.Mailbox.SLOT}
    with pytest.raises(ValueError, match="does not fit"):
        a.exchange(big, {1: intro[1]}, time.monotonic() + 1)
    assert b._read(0) is None


def test_an_unreadable_record_counts_as_missing(engines):
    (a, _), intro = _mailboxes(engines)
    slot = a.base + 1 * peers.Mailbox.SLOT
    ctypes.c_int32.from_address(slot + 8).value = 5
    ctypes.memmove(slot + 12, b"{nope", 5)
    ctypes.c_int64.from_address(slot).value = 1
    got, failed = a.exchange(_record(engines[0], 1), {1: intro[1]}, time.monotonic() + 0.2)
    assert got == {} and not failed
