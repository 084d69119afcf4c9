"""Every RPC and error code through a real gRPC server (in this process) and real client processes."""

import json
import threading
import urllib.error
import urllib.request

import grpc
import pytest

from mooncake.store.master.config import MAX_KEY_BYTES, MasterConfig
from mooncake.store.common.errors import ErrorCode as E
from mooncake.store.common.master_client import MasterClient, replicate_config, segment
from mooncake.store.master.rpc_server import MasterServer
from mooncake.store.master.testing import WorkerProcess
from mooncake.store.proto import mooncake_master_pb2 as pb

MiB = 1 << 20
PROCESSING, COMPLETE = pb.REPLICA_STATUS_PROCESSING, pb.REPLICA_STATUS_COMPLETE


@pytest.fixture(scope="module")
def server():
    cfg = MasterConfig(rpc_address="127.0.0.1", port=0, metrics_host="127.0.0.1", metrics_port=0,
                       client_ttl_sec=3600, default_kv_lease_ttl_ms=300, eviction_high_watermark_ratio=1.0)
    srv = MasterServer(cfg).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def workers(server):
    ws = [WorkerProcess(server.address) for _ in range(2)]
    for i, w in enumerate(ws):
        seg = {"seg_id": f"seg-{i}", "name": f"host{i}:1200{i}", "base": 0x7f0000000000 + i * (1 << 32),
               "size": 64 * MiB}
        assert w.request({"op": "mount", "segment": seg}) == {"ok": True, "code": 0}
    yield ws
    for w in ws:
        w.stop()


@pytest.fixture(autouse=True)
def clean(server):
    yield
    server.service.remove_all(force=True)


def test_service_info_and_ping(server, workers):
    w1, _ = workers
    info = w1.call("GetServiceInfo")
    assert info["code"] == 0 and info["default_kv_lease_ttl_ms"] == 300 and info["max_key_bytes"] == MAX_KEY_BYTES
    ping = w1.call("Ping")
    assert ping["client_status"] == pb.CLIENT_STATUS_OK and ping["view_version"] == info["view_version"]
    assert w1.call("Ping", client_id="stranger")["client_status"] == pb.CLIENT_STATUS_NEED_REMOUNT
    assert w1.call("Ping", client_id="")["code"] == E.INVALID_PARAMS


def test_segment_rpcs(server, workers):
    w1, w2 = workers
    seg = {"id": "extra", "name": "host0:12000", "base": 0x10000, "size": MiB, "te_endpoint": "h", "protocol": "tcp"}
    assert w1.call("MountSegment", segment=seg)["code"] == 0
    assert w1.call("MountSegment", segment=seg)["code"] == 0  # idempotent
    assert w2.call("MountSegment", segment=seg)["code"] == E.SEGMENT_ALREADY_EXISTS
    assert w1.call("MountSegment", segment={**seg, "id": "bad", "base": 0})["code"] == E.INVALID_PARAMS
    assert w1.call("MountSegment", segment={**seg, "id": "bad", "size": 0})["code"] == E.INVALID_PARAMS
    assert w1.call("MountSegment", segment={**seg, "id": "overlap", "base": 0x10000 + 4096})["code"] == E.INVALID_PARAMS
    assert w2.call("UnmountSegment", segment_id="extra")["code"] == E.ILLEGAL_CLIENT
    assert w1.call("UnmountSegment", segment_id="extra")["code"] == 0
    assert w1.call("UnmountSegment", segment_id="extra")["code"] == 0
    assert w1.call("ReMountSegment", segments=[seg])["code"] == 0
    assert w1.call("ReMountSegment", segments=[])["code"] == 0
    assert w1.call("UnmountSegment", segment_id="extra")["code"] == 0


def test_put_get_remove_across_processes(server, workers):
    w1, w2 = workers
    r = w1.call("PutStart", key="obj", size=1000, config={"replica_num": 2})
    assert r["code"] == 0 and len(r["replicas"]) == 2
    assert {d["segment_name"] for d in r["replicas"]} == {"host0:12000", "host1:12001"}
    for d in r["replicas"]:
        assert d["status"] == PROCESSING and d["size"] == 1000
        base = 0x7f0000000000 + (0 if d["segment_name"] == "host0:12000" else 1 << 32)
        assert base <= d["address"] < base + 64 * MiB
    assert w2.call("GetReplicaList", key="obj")["code"] == E.REPLICA_IS_NOT_READY
    assert w2.call("ExistKey", key="obj") == {"code": 0, "exists": False}
    assert w2.call("PutEnd", key="obj")["code"] == E.ILLEGAL_CLIENT
    assert w1.call("PutEnd", key="obj")["code"] == 0
    g = w2.call("GetReplicaList", key="obj")
    assert g["code"] == 0 and g["size"] == 1000 and 0 < g["lease_ttl_ms"] <= 300
    assert sorted(d["address"] for d in g["replicas"]) == sorted(d["address"] for d in r["replicas"])
    assert all(d["status"] == COMPLETE for d in g["replicas"])
    assert w2.call("ExistKey", key="obj") == {"code": 0, "exists": True}
    assert w1.call("PutStart", key="obj", size=10)["code"] == E.OBJECT_ALREADY_EXISTS
    assert w1.call("Remove", key="obj")["code"] == E.OBJECT_HAS_LEASE
    assert w1.call("Remove", key="obj", force=True)["code"] == 0
    assert w1.call("Remove", key="obj")["code"] == E.OBJECT_NOT_FOUND
    assert w1.call("PutRevoke", key="obj")["code"] == E.OBJECT_NOT_FOUND


def test_disk_replica_rpcs(server, workers):
    w1, w2 = workers
    assert w1.call("MountLocalDisk", endpoint="")["code"] == E.INVALID_PARAMS
    assert w1.call("MountLocalDisk", endpoint="127.0.0.1:7777")["code"] == 0
    # w2 writes into w1's segment: w1 (SSD tier) gets the offload task with its next ping.
    in_w1 = {"replica_num": 1, "preferred_segments": ["host0:12000"]}
    assert w2.call("PutStart", key="d", size=100, config=in_w1)["code"] == 0
    assert w2.call("PutEnd", key="d")["code"] == 0
    assert w1.call("Ping")["offload"] == []  # no capacity asked, no task handed out
    ping = w1.call("Ping", offload_capacity=8)
    [task] = ping["offload"]
    assert (task["key"], task["size"], ping["offload_backlog"]) == ("d", 100, 0) and task["version"] > 0
    objs = [{"key": "d", "size": 100, "seq": 5, "version": task["version"]},
            {"key": "never-put", "size": 1, "seq": 6, "version": task["version"]}]
    assert w2.call("NotifyOffloadSuccess", objects=objs)["codes"] == [E.CLIENT_NOT_FOUND] * 2
    assert w1.call("NotifyOffloadSuccess", objects=objs)["codes"] == [0, E.OBJECT_NOT_FOUND]
    g = w2.call("GetReplicaList", key="d")
    assert [d["type"] for d in g["replicas"]] == [pb.REPLICA_TYPE_MEMORY, pb.REPLICA_TYPE_LOCAL_DISK]
    assert g["replicas"][0]["address"] == task["address"]  # where w1 copies the bytes from
    disk = g["replicas"][1]
    assert (disk["client_id"], disk["transport_endpoint"], disk["size"], disk["disk_seq"], disk["status"]) == \
        (w1.client_id, "127.0.0.1:7777", 100, 5, COMPLETE)
    assert w2.call("PutStart", key="d", size=100, promote=True)["code"] == E.OBJECT_ALREADY_EXISTS
    assert w2.call("Remove", key="d", force=True)["code"] == 0
    ping = w1.call("Ping")
    assert ping["drop_disk"] == [{"key": "d", "size": 0, "seq": 5, "version": 0}]  # delete that file
    assert w1.call("Ping")["drop_disk"] == ping["drop_disk"]  # until acknowledged
    assert w1.call("Ping", drop_ack=ping["drop_seq"])["drop_disk"] == []
    assert w1.call("NotifyOffloadSuccess", objects=[{"key": "r", "size": 9, "seq": 1}], reload=True)["codes"] == [0]
    assert w2.call("ExistKey", key="r") == {"code": 0, "exists": True}
    assert w1.call("EvictDiskReplica", objects=[{"key": "r", "seq": 2}, {"key": "r"}])["codes"] == \
        [E.REPLICA_NOT_FOUND, 0]
    assert w2.call("ExistKey", key="r") == {"code": 0, "exists": False}
    assert w1.call("NotifyOffloadSuccess", objects=[{"key": "r", "size": 9, "seq": 1}], reload=True)["codes"] == [0]
    assert w1.call("UnmountLocalDisk") == {"code": 0, "count": 1}
    assert w2.call("ExistKey", key="r") == {"code": 0, "exists": False}


def test_invalid_and_no_space(server, workers):
    w1, _ = workers
    assert w1.call("PutStart", key="", size=10)["code"] == E.INVALID_PARAMS
    assert w1.call("PutStart", key="k", size=0)["code"] == E.INVALID_PARAMS
    assert w1.call("PutStart", key="k", size=10, config={"replica_num": 0})["code"] == E.INVALID_PARAMS
    assert w1.call("PutStart", key="k" * (MAX_KEY_BYTES + 1), size=10)["code"] == E.INVALID_KEY
    assert w1.call("PutStart", key="k", size=1 << 40)["code"] == E.NO_AVAILABLE_HANDLE
    assert w1.call("PutStart", key="k", size=10, client_id="")["code"] == E.INVALID_PARAMS
    r = w1.call("PutStart", key="k", size=10)
    assert w1.call("PutRevoke", key="k")["code"] == 0 and r["code"] == 0


def test_batch_rpcs(server, workers):
    w1, w2 = workers
    keys = [f"b{i}" for i in range(5)]
    r = w1.call("BatchPutStart", keys=keys, sizes=[100] * 5, config={"replica_num": 1})
    assert [x["code"] for x in r["results"]] == [0] * 5
    assert w1.call("BatchPutStart", keys=["x", "y"], sizes=[1])["results"][1]["code"] == E.INVALID_PARAMS
    assert w1.call("BatchPutRevoke", keys=["b4"])["codes"] == [0]
    assert w1.call("BatchPutEnd", keys=keys)["codes"] == [0, 0, 0, 0, E.OBJECT_NOT_FOUND]
    ex = w2.call("BatchExistKey", keys=keys)["results"]
    assert [x["exists"] for x in ex] == [True] * 4 + [False]
    g = w2.call("BatchGetReplicaList", keys=keys)["results"]
    assert [x["code"] for x in g] == [0] * 4 + [E.OBJECT_NOT_FOUND] and g[0]["size"] == 100
    assert w2.call("BatchRemove", keys=keys)["codes"] == [E.OBJECT_HAS_LEASE] * 4 + [E.OBJECT_NOT_FOUND]
    assert w2.call("BatchRemove", keys=keys, force=True)["codes"] == [0] * 4 + [E.OBJECT_NOT_FOUND]
    assert w1.call("BatchPutStart", keys=[], sizes=[])["results"] == []


def test_upsert_rpcs(server, workers):
    w1, w2 = workers
    a = w1.call("UpsertStart", key="u", size=64)
    assert a["code"] == 0 and w1.call("UpsertEnd", key="u")["code"] == 0
    b = w1.call("UpsertStart", key="u", size=64)
    assert b["replicas"][0]["address"] == a["replicas"][0]["address"]  # same size: in place
    assert w2.call("UpsertStart", key="u", size=64)["code"] == E.OBJECT_REPLICA_BUSY
    assert w1.call("UpsertEnd", key="u")["code"] == 0
    c = w1.call("UpsertStart", key="u", size=4096)
    assert c["code"] == 0 and w2.call("GetReplicaList", key="u")["size"] == 64  # old readable meanwhile
    assert w1.call("UpsertRevoke", key="u")["code"] == 0
    assert w2.call("GetReplicaList", key="u")["size"] == 64
    r = w1.call("BatchUpsertStart", keys=["u", "v"], sizes=[128, 128])
    assert [x["code"] for x in r["results"]] == [0, 0]
    assert w1.call("BatchUpsertEnd", keys=["u"])["codes"] == [0]
    assert w1.call("BatchUpsertRevoke", keys=["v"])["codes"] == [0]
    assert w2.call("GetReplicaList", key="u")["size"] == 128
    assert w2.call("ExistKey", key="v")["exists"] is False


def test_regex_and_remove_all(server, workers):
    w1, w2 = workers
    for k in ("r/a", "r/b", "s/a"):
        assert w1.call("PutStart", key=k, size=10)["code"] == 0
        assert w1.call("PutEnd", key=k)["code"] == 0
    g = w2.call("GetReplicaListByRegex", pattern="^r/")
    assert g["code"] == 0 and sorted(g["keys"]) == ["r/a", "r/b"] and all(x["code"] == 0 for x in g["results"])
    assert w2.call("RemoveByRegex", pattern="^r/") == {"code": 0, "count": 0}  # leased
    assert w2.call("RemoveByRegex", pattern="^r/", force=True) == {"code": 0, "count": 2}
    assert w2.call("RemoveByRegex", pattern="(")["code"] == E.INVALID_PARAMS
    assert w2.call("GetReplicaListByRegex", pattern="(")["code"] == E.INVALID_PARAMS
    assert w2.call("RemoveAll") == {"code": 0, "count": 1}
    assert w2.call("RemoveAll") == {"code": 0, "count": 0}


def test_copy_move_tasks_and_clear(server, workers):
    w1, w2 = workers
    h0, h1 = "host0:12000", "host1:12001"
    w1.call("PutStart", key="c", size=4096, config={"replica_num": 1, "preferred_segments": [h0]})
    w1.call("PutEnd", key="c")
    r = w2.call("CopyStart", key="c", source=h0, targets=[h1])
    assert r["code"] == 0 and r["source"]["segment_name"] == h0 and r["targets"][0]["segment_name"] == h1
    assert r["targets"][0]["status"] == PROCESSING
    assert w1.call("Remove", key="c")["code"] == E.OBJECT_HAS_REPLICATION_TASK
    assert w1.call("CopyEnd", key="c")["code"] == E.ILLEGAL_CLIENT
    assert w2.call("CopyEnd", key="c")["code"] == 0
    assert len(w2.call("GetReplicaList", key="c")["replicas"]) == 2
    assert w2.call("CopyStart", key="c", targets=[h1])["code"] == E.REPLICA_ALREADY_EXISTS
    assert w2.call("CopyEnd", key="c")["code"] == E.OBJECT_NO_REPLICATION_TASK
    cleared = w2.call("BatchReplicaClear", keys=["c"], segment_name=h1)
    assert cleared["cleared_keys"] == []  # leased by the GetReplicaList above
    server.service.table.leases.clear()
    assert w2.call("BatchReplicaClear", keys=["c"], segment_name=h1)["cleared_keys"] == ["c"]
    m = w2.call("MoveStart", key="c", source=h0, target=h1)
    assert m["code"] == 0
    assert w2.call("MoveRevoke", key="c")["code"] == 0
    assert w2.call("MoveStart", key="c", source=h0, target=h1)["code"] == 0
    assert w2.call("MoveEnd", key="c")["code"] == 0
    assert [d["segment_name"] for d in w2.call("GetReplicaList", key="c")["replicas"]] == [h1]
    server.service.table.leases.clear()
    t = w1.call("CreateCopyTask", key="c", targets=[h0])
    assert t["code"] == 0 and t["task_id"]
    assert w1.call("CreateMoveTask", key="c", source=h1, target=h0)["code"] == E.OBJECT_HAS_REPLICATION_TASK
    q = w1.call("QueryTask", task_id=t["task_id"])
    assert q["task"]["status"] == pb.TASK_STATUS_PENDING and q["task"]["type"] == pb.TASK_TYPE_COPY
    executor = w1 if q["task"]["assigned_client"] == w1.client_id else w2  # owner of host0
    assert executor is w1
    f = w1.call("FetchTasks", batch_size=4)
    assert [x["task_id"] for x in f["tasks"]] == [t["task_id"]]
    assert w1.call("CopyStart", key="c", source=h1, targets=[h0])["code"] == 0
    assert w1.call("CopyEnd", key="c")["code"] == 0
    assert w1.call("MarkTaskToComplete", task_id=t["task_id"], success=True)["code"] == 0
    assert w1.call("QueryTask", task_id=t["task_id"])["task"]["status"] == pb.TASK_STATUS_SUCCESS
    assert w1.call("QueryTask", task_id="nope")["code"] == E.TASK_NOT_FOUND
    assert w1.call("CreateCopyTask", key="zzz", targets=[h0])["code"] == E.OBJECT_NOT_FOUND
    assert w1.call("FetchTasks", client_id="")["code"] == E.INVALID_PARAMS
    w1.call("PutStart", key="c2", size=4096, config={"replica_num": 1, "preferred_segments": [h0]})
    w1.call("PutEnd", key="c2")
    used = server.service.snapshot()["used_bytes"]
    assert w2.call("CopyStart", key="c2", targets=[h1])["code"] == 0
    assert server.service.snapshot()["used_bytes"] == used + 4096
    assert w1.call("CopyRevoke", key="c2")["code"] == E.ILLEGAL_CLIENT
    assert w2.call("CopyRevoke", key="c2")["code"] == 0
    assert w2.call("CopyRevoke", key="c2")["code"] == E.OBJECT_NO_REPLICATION_TASK
    assert server.service.snapshot()["used_bytes"] == used


def _http(server, path):
    url = f"http://127.0.0.1:{server.admin_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_admin_http(server, workers):
    w1, _ = workers
    w1.call("PutStart", key="m", size=100)
    w1.call("PutEnd", key="m")
    code, text = _http(server, "/metrics")
    assert code == 200
    assert "master_key_count 1.0" in text
    assert 'master_requests_total{op="put_start"}' in text
    assert 'master_rpc_latency_seconds_bucket{le="0.0001",method="PutStart"}' in text
    assert 'master_segment_capacity_bytes{id="seg-0",segment="host0:12000"} 6.7108864e+07' in text
    code, body = _http(server, "/health")
    assert code == 200 and json.loads(body)["status"] == "ok"
    code, body = _http(server, "/status")
    status = json.loads(body)
    assert code == 200 and status["objects"] == 1 and len(status["segments"]) == 2
    assert status["segments"][0]["fragmentation"] >= 0
    code, body = _http(server, "/query_key?key=m")
    assert code == 200 and json.loads(body)["data"]["size"] == 100
    code, body = _http(server, "/query_key?key=none")
    assert code == 404 and json.loads(body)["error_code"] == E.OBJECT_NOT_FOUND
    assert _http(server, "/query_key")[0] == 400
    assert _http(server, "/metrics/summary")[0] == 200
    assert _http(server, "/get_all_segments")[1] == "host0:12000\nhost1:12001\n"
    assert _http(server, "/nope")[0] == 404


def test_many_threads_one_master(server, workers):
    """16 threads of one process hammer overlapping keys; the pool ends exactly empty."""
    errors = []

    def run(t):
        with MasterClient(server.address, client_id=f"thread-{t}") as c:
            for i in range(40):
                key = f"t{i % 10}"
                r = c.call("PutStart", key=key, size=512 + t, config=replicate_config(replica_num=2))
                if r.code == 0:
                    # OBJECT_NOT_FOUND: another thread's Remove(force=True) revoked this put meanwhile
                    end = c.call("PutEnd", key=key).code
                    if end not in (0, E.OBJECT_NOT_FOUND):
                        errors.append(("end", end))
                elif r.code not in (E.OBJECT_ALREADY_EXISTS,):
                    errors.append(r.code)
                g = c.call("GetReplicaList", key=key)
                if g.code == 0 and g.size not in range(512, 512 + 16):
                    errors.append("size")
                rm = c.call("Remove", key=key, force=True)
                if rm.code not in (0, E.OBJECT_NOT_FOUND, E.REPLICA_IS_NOT_READY):
                    errors.append(rm.code)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == []
    assert not any(th.is_alive() for th in threads)
    svc = server.service
    svc.remove_all(force=True)
    svc.tick()
    s = svc.snapshot()
    assert s["pending_puts"] == 0 and s["objects"] == 0
    assert s["used_bytes"] == s["held_bytes"]  # no space leaked by the races (held: leased/revoked buffers)


def test_concurrent_client_processes(server, workers):
    for w in workers:
        w.send({"op": "loop", "kind": "put_get_remove", "prefix": f"{w.client_id}/", "size": 4096, "count": 150})
    results = [w.receive(timeout=120) for w in workers]
    for r in results:
        assert r["ok"] and r["items"] == 150 and r["errors"] == {}
    s = server.service.snapshot()
    assert s["objects"] == 0 and s["pending_puts"] == 0
    assert s["used_bytes"] == s["held_bytes"]  # everything else went back to the allocators


def test_master_client_remembers_segments_for_remount(server):
    c = MasterClient(server.address)
    try:
        assert c.mount(segment("rm-1", "rm-host:1", 0x1000, MiB)) == 0
        server.service.clients.forget(c.client_id)  # as if expired
        assert c.ping_once().client_status == pb.CLIENT_STATUS_NEED_REMOUNT
        assert c.remounts == 1 and c.ping_once().client_status == pb.CLIENT_STATUS_OK
        assert c.unmount("rm-1") == 0
        with pytest.raises(ValueError):
            c.call("NoSuchRpc")
    finally:
        c.close()


def test_stalled_grpc_calls_tie_up_no_worker():
    """Calls whose request message never arrives (3 x 8 of them, against 2 workers) leave the gRPC door
    serving everyone else: requests are received on the event loop, only complete ones reach a worker (the
    synchronous server gave each call a worker at once, which then waited for its request forever)."""
    from mooncake.testing.listener_fuzz import StalledGrpcCalls

    cfg = MasterConfig(rpc_address="127.0.0.1", port=0, fast_rpc_port=-1, max_threads=2,
                       enable_metric_reporting=False)
    with MasterServer(cfg) as srv:
        path = "/mooncake.store.master.MasterService/GetReplicaList"
        with StalledGrpcCalls(("127.0.0.1", srv.port), path, connections=3, streams=8):
            with MasterClient(srv.address) as c:
                for _ in range(20):
                    assert c.stub.ExistKey(pb.KeyRequest(key="k"), timeout=5).code == 0
                big = pb.BatchKeysRequest(keys=["k" * MAX_KEY_BYTES] * 1100)  # over MAX_REQUEST_BYTES
                with pytest.raises(grpc.RpcError) as err:
                    c.stub.BatchExistKey(big, timeout=10)
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
