import math
import signal

import pytest

from mooncake.tools.common import ToolError
from mooncake.tools.replay import SCHEDULERS, ClusterConfig, _Simulation, plot_ttft, simulate
from mooncake.tools.testutil import make_trace, released_trace

CFG = ClusterConfig()


def T(n):
    """The paper's Fig. 14 fit, written out."""
    return 1.13e-4 * n + 7.39e-10 * n * n


def step(context_tokens):
    return 0.0262 + 3.5e-8 * context_tokens


def transfer(tokens):
    return tokens * 327_680 * 8 / 800e9


@pytest.mark.parametrize("k_tokens, paper_s", [(8, 1.00), (16, 2.05), (32, 4.48), (64, 10.59), (128, 27.51)])
def test_prefill_model_reproduces_fig14(k_tokens, paper_s):
    assert CFG.prefill_time(k_tokens * 1024) == pytest.approx(paper_s, abs=0.03)


def test_cost_formulas():
    assert CFG.prefill_time(5000, 2000) == pytest.approx(T(5000) - T(2000))
    assert CFG.prefill_time(1024, 1024) == pytest.approx(T(1024) - T(1023))  # the last token is recomputed
    assert CFG.transfer_time(131_072) == pytest.approx(131_072 * 327_680 * 8 / 800e9)  # 0.43 s for 128k
    assert 1000 * CFG.step_time(8192) == pytest.approx(3.39 / 128 * 1000, abs=0.5)  # Fig. 14 decode, 8k
    assert 1000 * CFG.step_time(131_072) == pytest.approx(3.94 / 128 * 1000, abs=0.5)  # 128k


def one_node(**kw):
    return ClusterConfig(**dict(dict(prefill_nodes=1, decode_nodes=1), **kw))


def test_single_request_timeline():
    trace = make_trace([[0, 1]], outputs=[11])
    r = simulate(trace, "load-balance", one_node())
    tau = step(1024)
    assert r.ttft_by_request == [pytest.approx(T(1024))]
    assert r.tbt_by_request == [pytest.approx(tau)]
    assert r.makespan_s == pytest.approx(T(1024) + 10 * tau)
    assert (r.requests, r.completed, r.rejected, r.slo_attainment) == (1, 1, 0, 1.0)
    assert r.prefill_load[0]["busy_s"] == pytest.approx(T(1024))
    assert r.decode_load[0]["mean_batch"] == pytest.approx(10 * tau / r.makespan_s)


def test_queueing_and_prefix_reuse_on_one_prefill_node():
    # Same prompt twice at t=0: the second queues and finds no cache (blocks are stored when a prefill ends).
    r = simulate(make_trace([[0, 1], [0, 1]]), "local-cache-aware", one_node())
    assert r.ttft_by_request == [pytest.approx(T(1024)), pytest.approx(2 * T(1024))]
    # 10 s later the prefix is cached: only the partial last block's last token is computed.
    later = make_trace([[0, 1], [0, 1]], timestamps=[0, 10_000], input_lengths=[1000, 1000])
    r = simulate(later, "local-cache-aware", one_node())
    assert r.ttft_by_request[1] == pytest.approx(T(1000) - T(999))
    assert r.cache_hit_ratio == pytest.approx(1000 / 2000)


def test_global_cache_aware_fetches_a_remote_prefix_and_replicates_it():
    prompt = [0, 1, 2, 3]
    long_other = [0] + list(range(100, 163))  # shares block 0, keeps node 0 busy for ~4.5 s
    trace = make_trace([prompt, long_other, prompt], timestamps=[0, 1000, 1500])
    cfg = ClusterConfig(prefill_nodes=2, decode_nodes=1)
    local = simulate(trace, "local-cache-aware", cfg)
    assert local.ttft_by_request[2] == pytest.approx(T(2048))  # recomputed on idle node 1
    assert local.remote_hit_ratio == 0
    sim = _Simulation(trace, "global-cache-aware", cfg)
    glob = sim.run()
    assert glob.ttft_by_request[2] == pytest.approx(transfer(2048) + T(2048) - T(2047))
    assert glob.remote_hit_ratio == pytest.approx(2048 / (2048 + 32768 + 2048))
    assert glob.cache_hit_ratio == pytest.approx((512 + 2048) / (2048 + 32768 + 2048))
    assert [p["requests"] for p in glob.prefill_load] == [2, 1]
    assert sim.prefill[1].cache.prefix_len(prompt) == 4  # the hot prefix now has a replica on node 1


@pytest.mark.parametrize("limit", [dict(decode_batch=1), dict(decode_kv_tokens=1500)])
def test_decode_batching_and_waiting(limit):
    trace = make_trace([[0, 1], [5, 6]], outputs=[11, 11])
    both = simulate(trace, "load-balance", ClusterConfig(prefill_nodes=2, decode_nodes=1))
    assert both.tbt_by_request == [pytest.approx(step(2048))] * 2  # one batch of two
    tau = step(1024)
    serial = simulate(trace, "load-balance", ClusterConfig(prefill_nodes=2, decode_nodes=1, **limit))
    # The second request waits for the first (10 steps); its longest gap (10% of 10 gaps = 1) includes that wait.
    assert sorted(serial.tbt_by_request) == [pytest.approx(tau), pytest.approx(11 * tau)]
    assert serial.mean_tbt_s == pytest.approx(6 * tau)
    assert serial.decode_load[0]["max_batch"] == 1


def test_tiny_decode_steps_still_finish():
    # A step far below the clock's resolution at t = 1000 s: the finish event lands at the current time, and the
    # batch used to be rescheduled there forever. The alarm turns a hang into a failure.
    def hang(*_):
        raise TimeoutError("the replay did not terminate")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(30)
    try:
        trace = make_trace([[0, 1], [5, 6]], timestamps=[0, 1_000_000], outputs=[50, 50])
        r = simulate(trace, "load-balance", one_node(decode_step_s=1e-18, decode_ctx_s=0.0))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert r.completed == 2 and all(t is not None and t < 1e-9 for t in r.tbt_by_request)
    assert r.makespan_s == pytest.approx(1000 + T(1024))


def test_kv_transfer_to_decode_can_delay_the_second_token():
    slow = ClusterConfig(prefill_nodes=1, decode_nodes=1, bandwidth_gbps=1.0)
    r = simulate(make_trace([[0, 1]], outputs=[2]), "random", slow)
    wait = transfer(1024) * 800 - T(1024)  # KV streamed from prefill start at 1 Gbps
    assert r.tbt_by_request[0] == pytest.approx(wait + step(1024))


def test_early_rejection_keeps_accepted_requests_within_the_ttft_slo():
    trace = released_trace("conversation").head(1500)
    cfg = ClusterConfig(prefill_nodes=2, decode_nodes=2, ttft_slo_s=2.0, early_rejection=True)
    r = simulate(trace, "load-balance", cfg)
    assert r.rejected > 0
    assert max(t for t in r.ttft_by_request if t is not None) <= 2.0 + 1e-9
    assert r.slo_attainment <= r.completed / r.requests
    without = simulate(trace, "load-balance", ClusterConfig(prefill_nodes=2, decode_nodes=2, ttft_slo_s=2.0))
    assert without.rejected == 0 and without.mean_ttft_s > r.mean_ttft_s


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_invariants_on_the_released_trace(scheduler):
    trace = released_trace("conversation").head(1500)
    r = simulate(trace, scheduler, ClusterConfig(prefill_nodes=4, decode_nodes=4))
    assert (r.completed, r.rejected) == (len(trace), 0)
    assert all(t is not None and t > 0 for t in r.ttft_by_request)
    assert sum(p["requests"] for p in r.prefill_load) == len(trace)
    decoded = [d["requests"] for d in r.decode_load]
    assert sum(decoded) == sum(1 for m in trace.output_lengths if m > 1)
    assert min(decoded) > 0.6 * max(decoded)  # spread by context tokens, so counts differ somewhat
    assert all(0 < p["utilization"] <= 1 + 1e-9 for p in r.prefill_load)
    assert r.p50_ttft_s <= r.p90_ttft_s <= r.p99_ttft_s
    assert r.p50_tbt_s <= r.p90_tbt_s <= r.p99_tbt_s and r.mean_tbt_s >= CFG.decode_step_s
    assert 0 <= r.remote_hit_ratio <= r.cache_hit_ratio <= 1
    if scheduler != "global-cache-aware":
        assert r.remote_hit_ratio == 0
    looser = simulate(trace, scheduler, ClusterConfig(prefill_nodes=4, decode_nodes=4, ttft_slo_s=1e6, tbt_slo_s=1e6))
    assert looser.slo_attainment == 1.0 >= r.slo_attainment
    assert set(r.to_json()) >= {"policy", "mean_ttft_s", "p99_ttft_s", "mean_tbt_s", "slo_attainment",
                                "rejected", "cache_hit_ratio", "prefill_load", "decode_load"}


def test_random_policy_is_seeded():
    trace = released_trace("conversation").head(500)
    a, b = (simulate(trace, "random", ClusterConfig(seed=s)) for s in (0, 0))
    c = simulate(trace, "random", ClusterConfig(seed=1))
    assert a.ttft_by_request == b.ttft_by_request != c.ttft_by_request


def test_speed_factor_compresses_arrivals():
    trace = released_trace("conversation").head(1500)
    slow, fast = (simulate(trace, "load-balance", ClusterConfig(speed=s)) for s in (1, 2))
    assert fast.makespan_s < slow.makespan_s and fast.mean_ttft_s > slow.mean_ttft_s


def test_fig5_ordering_of_mean_ttft_on_the_conversation_trace():
    # P Fig. 5: 16 nodes, conversation trace; random > load balancing > local cache-aware > global cache-aware.
    paper = {"random": 19.65, "load-balance": 5.27, "local-cache-aware": 3.58, "global-cache-aware": 3.07}
    trace = released_trace("conversation")
    cfg = ClusterConfig(prefill_nodes=8, decode_nodes=8)
    ours = {s: simulate(trace, s, cfg).mean_ttft_s for s in SCHEDULERS}
    print("\npolicy               ours (8P+8D)  paper (16 nodes)")
    for s in SCHEDULERS:
        print(f"{s:20s} {ours[s]:8.2f} s    {paper[s]:6.2f} s")
    values = [ours[s] for s in SCHEDULERS]
    assert values == sorted(values, reverse=True) and len(set(values)) == 4


@pytest.mark.parametrize("kw, message", [
    (dict(prefill_nodes=0), "prefill_nodes must be > 0"),
    (dict(speed=0.0), "speed must be > 0"),
    (dict(node_cache_tokens=100), "less than one 512-token block"),
    (dict(balance_threshold=0.5), "balance threshold"),
    (dict(prefill_a=-1.0), "prefill_a must be a finite number >= 0"),
    (dict(decode_step_s=0.0, decode_ctx_s=0.0), "decode_step_s must be > 0"),  # used to loop forever
])
def test_invalid_configuration(kw, message):
    with pytest.raises(ToolError, match=message):
        simulate(make_trace([[0]]), "random", ClusterConfig(**kw))


def test_unknown_policy_and_plot(tmp_path):
    trace = make_trace([[0, 1], [0, 1]], timestamps=[0, 5000], outputs=[3, 3])
    with pytest.raises(ToolError, match="unknown policy"):
        simulate(trace, "round-robin")
    results = [simulate(trace, s, one_node()) for s in SCHEDULERS]
    plot_ttft(results, str(tmp_path / "ttft.png"))
    assert (tmp_path / "ttft.png").read_bytes()[:4] == b"\x89PNG"
    assert all(not math.isnan(r.mean_tbt_s) for r in results)
