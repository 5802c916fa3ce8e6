"""Scheduler: token budget, chunked prefill, step inputs, prefix hits, n > 1, preemption, priority, finishing."""

import numpy as np
import pytest

from ingot.runtime.request import Request, RequestStatus
from ingot.runtime.scheduler import CacheConfig, Scheduler, SchedulerConfig, build_step_inputs, decode_steps_inputs

BS = 4


def make(num_blocks=64, block_size=BS, caching=True, **kw) -> Scheduler:
    kw.setdefault("max_model_len", 256)
    return Scheduler(SchedulerConfig(**kw), CacheConfig(num_blocks, block_size, enable_prefix_caching=caching))


def req(rid, tokens, max_tokens=8, **kw) -> Request:
    return Request(rid, list(tokens), max_tokens=max_tokens, **kw)


def step(s: Scheduler, token: int = 7):
    out = s.schedule()
    updated = s.update_from_output(out, [token] * len(out.req_ids))
    return out, updated


def check_step_inputs(s: Scheduler, out) -> None:
    """The step inputs agree with a slow per-token construction from the requests' state."""
    si = out.step_inputs
    pos, ids, slots = [], [], []
    for r, n, L in zip(out.requests, si.query_start_loc[1:] - si.query_start_loc[:-1], si.seq_lens):
        bt = s.kv.get_block_ids(r.request_id) if r.request_id in s.kv.req_blocks else None
        for p in range(L - n, L):
            pos.append(p)
            ids.append(r.all_token_ids[p])
            if bt is not None:
                slots.append(bt[p // s.block_size] * s.block_size + p % s.block_size)
    assert si.positions.tolist() == pos
    assert si.input_ids.tolist() == ids
    if len(slots) == len(pos):
        assert si.slot_mapping.tolist() == slots
    assert si.logits_indices.tolist() == (si.query_start_loc[1:] - 1).tolist()
    assert si.input_ids.dtype == np.int64 and si.block_tables.dtype == np.int32
    assert si.seq_lens.dtype == np.int32 and si.query_start_loc.dtype == np.int32


def test_build_step_inputs_matches_the_serving_form_example():
    bt = np.arange(40, dtype=np.int32).reshape(4, 10)  # row r holds blocks 10r .. 10r+9
    si = build_step_inputs(list(range(11)), [0, 9, 4], [6, 1, 4], [0, 1, 2], bt, 4)
    assert si.query_start_loc.tolist() == [0, 6, 7, 11]
    assert si.logits_indices.tolist() == [5, 6, 10]
    assert si.positions.tolist() == [0, 1, 2, 3, 4, 5, 9, 4, 5, 6, 7]
    assert si.seq_lens.tolist() == [6, 10, 8]
    assert si.slot_mapping.tolist() == [0, 1, 2, 3, 4, 5, 10 * 4 + 9 - 8 + 8, 20 * 4 + 4, 85, 86, 87]
    assert si.block_tables.shape == (3, 3) and si.block_tables[1].tolist() == [10, 11, 12]
    assert set(si.as_feeds()) == {
        "input_ids",
        "positions",
        "slot_mapping",
        "block_tables",
        "seq_lens",
        "query_start_loc",
        "logits_indices",
    }


@pytest.mark.parametrize("num_rows", [1, 3, 16])
def test_decode_steps_inputs_are_build_step_inputs_per_step(num_rows):
    """The decode steps' inputs made in one pass (``Scheduler.plan_decode_steps``) equal ``build_step_inputs`` of
    each step: values, dtypes and shapes, with steps crossing block boundaries and rows of other lengths."""
    r = np.random.default_rng(num_rows)
    bs, blocks = 4, 12
    table = r.permutation(400)[: 20 * blocks].reshape(20, blocks).astype(np.int32)
    rows = r.choice(20, num_rows, replace=False).tolist()
    first = r.integers(0, bs * blocks - 9, num_rows).astype(np.int64)
    first[0] = bs - 2  # the next steps cross into a new block
    got = decode_steps_inputs(first, 8, rows, table, bs)
    assert len(got) == 7
    for j, si in enumerate(got, start=1):
        want = build_step_inputs(np.zeros(num_rows, np.int64), first + j, [1] * num_rows, rows, table, bs)
        for name, a in want.as_feeds().items():
            b = si.as_feeds()[name]
            assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b), (j, name)
    assert decode_steps_inputs(first, 1, rows, table, bs) == []


def test_prefill_then_decode():
    s = make(max_num_batched_tokens=64)
    s.add_request(req("a", range(10), max_tokens=3))
    out, upd = step(s, 11)
    assert out.num_scheduled_tokens == {"a": 10} and out.new_req_ids == ["a"]
    assert out.do_sample.tolist() == [True]
    assert [r.output_token_ids for r in upd] == [[11]]
    check_step_inputs(s, out)
    out, _ = step(s, 12)
    assert out.num_scheduled_tokens == {"a": 1}
    assert out.step_inputs.positions.tolist() == [10] and out.step_inputs.input_ids.tolist() == [11]
    check_step_inputs(s, out)
    out, upd = step(s, 13)
    assert upd[0].status == RequestStatus.FINISHED_LENGTH and upd[0].finish_reason == "length"
    assert upd[0].output_token_ids == [11, 12, 13]
    assert not s.has_unfinished_requests() and s.kv.num_used_blocks == 0
    assert s.schedule().finished_req_ids == ["a"]


def test_chunked_prefill_and_token_budget():
    s = make(max_num_batched_tokens=32)
    s.add_request(req("a", range(100)))
    chunks = []
    for _ in range(4):
        out, upd = step(s)
        check_step_inputs(s, out)
        chunks.append(out.num_scheduled_tokens["a"])
        assert out.do_sample.tolist() == [len(chunks) == 4]
        assert (upd != []) == (len(chunks) == 4)
    assert chunks == [32, 32, 32, 4]
    assert s.get_request("a").output_token_ids == [7]


def test_running_requests_first_then_waiting_share_the_budget():
    s = make(max_num_batched_tokens=16)
    s.add_request(req("a", range(6)))
    step(s)
    s.add_request(req("b", range(100, 140)))
    out, _ = step(s)
    assert out.req_ids == ["a", "b"] and out.num_scheduled_tokens == {"a": 1, "b": 15}
    check_step_inputs(s, out)
    assert out.total_num_scheduled_tokens == 16


def test_long_prefill_token_threshold():
    s = make(max_num_batched_tokens=64, long_prefill_token_threshold=8)
    s.add_request(req("a", range(20)))
    s.add_request(req("b", range(50, 70)))
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"a": 8, "b": 8}


def test_max_num_seqs():
    s = make(max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(3):
        s.add_request(req(f"r{i}", [i] * 5))
    out, _ = step(s)
    assert out.req_ids == ["r0", "r1"] and s.num_waiting == 1


def test_chunked_prefill_off_waits_for_a_whole_prompt():
    s = make(max_num_batched_tokens=16, enable_chunked_prefill=False)
    s.add_request(req("a", range(10)))
    s.add_request(req("b", range(20, 30)))
    out, _ = step(s)
    assert out.req_ids == ["a"]
    with pytest.raises(ValueError, match="without chunked prefill"):
        s.add_request(req("c", range(17)))


def test_prefix_hit_after_a_finished_request():
    s = make(max_num_batched_tokens=256)
    prefix = list(range(1, 33))
    s.add_request(req("a", prefix + [40, 41], max_tokens=1))
    step(s)
    assert s.kv.num_used_blocks == 0  # finished; its full blocks stay cached in the free queue
    s.add_request(req("b", prefix + [50, 51, 52], max_tokens=1))
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"b": 3}  # 32 of 35 tokens found
    assert out.step_inputs.positions.tolist() == [32, 33, 34]
    assert out.step_inputs.seq_lens.tolist() == [35]
    st = s.stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (34 + 35, 32)
    assert s.get_request("b") is None


def test_whole_prompt_cached_still_computes_the_last_token():
    s = make()
    s.add_request(req("a", range(8), max_tokens=1))
    step(s)
    s.add_request(req("b", range(8), max_tokens=1))
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"b": 4}  # block 1 holds the last token: recomputed


def test_n_requests_with_one_prompt_share_blocks_in_the_same_step():
    s = make(max_num_batched_tokens=256)
    prompt = list(range(10))
    for i in range(3):
        s.add_request(req(f"c{i}", prompt))
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"c0": 10, "c1": 2, "c2": 2}
    tables = [s.kv.get_block_ids(f"c{i}") for i in range(3)]
    assert tables[0][:2] == tables[1][:2] == tables[2][:2]
    assert len({t[2] for t in tables}) == 3  # the partial block is private
    assert [b.ref_cnt for b in s.kv.req_blocks["c0"]] == [3, 3, 1]
    assert s.kv.num_used_blocks == 5
    check_step_inputs(s, out)


def test_fork_request_shares_the_parents_blocks():
    s = make(caching=False, max_num_batched_tokens=256)
    s.add_request(req("p", range(10)))
    step(s)
    s.fork_request("p", req("c", range(10)))
    assert s.get_request("c").num_computed_tokens == 8
    assert [b.ref_cnt for b in s.kv.req_blocks["p"]] == [2, 2, 1]
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"p": 1, "c": 2} and out.new_req_ids == ["c"]
    assert s.kv.get_block_ids("c")[:2] == s.kv.get_block_ids("p")[:2]
    check_step_inputs(s, out)
    s.abort_request("p")
    s.abort_request("c")
    assert s.kv.num_used_blocks == 0
    with pytest.raises(KeyError):
        s.fork_request("p", req("d", range(10)))


def test_fork_into_a_full_running_set_queues_the_child_without_blocks():
    s = make(max_num_seqs=1, max_num_batched_tokens=256)
    s.add_request(req("p", range(10)))
    step(s)
    s.fork_request("p", req("c", range(10)))
    assert s.get_request("c").status == RequestStatus.WAITING and "c" not in s.kv.req_blocks


def test_preemption_by_recompute_and_resumption():
    # 6 blocks of 4: two requests of 8 prompt tokens each grow until one must give way
    s = make(num_blocks=6, max_num_batched_tokens=64)
    s.add_request(req("a", range(8), max_tokens=12, arrival_time=1.0))
    s.add_request(req("b", range(100, 108), max_tokens=12, arrival_time=2.0))
    preempted = []
    tokens = iter(range(1000, 2000))
    while s.has_unfinished_requests():
        out = s.schedule()
        check_step_inputs(s, out)
        preempted += out.preempted_req_ids
        assert all(len(s.kv.req_blocks[r]) * BS >= s.get_request(r).num_computed_tokens for r in out.req_ids)
        s.update_from_output(out, [next(tokens) for _ in out.req_ids])
        if out.preempted_req_ids:
            b = s.get_request("b")
            assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
            assert next(iter(s.waiting)) is b
    assert preempted and set(preempted) == {"b"}  # the latest arrival gives way
    assert s.kv.num_used_blocks == 0 and s.stats().num_preemptions == len(preempted)


def test_resumed_request_recomputes_from_the_prefix_cache():
    s = make(num_blocks=6, max_num_batched_tokens=64)
    s.add_request(req("a", range(8), max_tokens=12, arrival_time=1.0))
    s.add_request(req("b", range(100, 108), max_tokens=12, arrival_time=2.0))
    resumed = None
    for _ in range(40):
        out, _ = step(s)
        b = s.get_request("b")
        if b and "b" in out.new_req_ids and b.num_preemptions:
            resumed = out.num_scheduled_tokens["b"], b.num_tokens
            break
    assert resumed is not None
    n_sched, n_tokens = resumed
    assert n_sched < n_tokens  # part of its tokens came back from the prefix cache


def test_priority_order_and_victim():
    s = make(num_blocks=6, max_num_batched_tokens=64, max_num_seqs=2, policy="priority")
    s.add_request(req("low", range(4), max_tokens=12, priority=5, arrival_time=1.0))
    s.add_request(req("high", range(10, 14), max_tokens=12, priority=0, arrival_time=2.0))
    s.add_request(req("mid", range(20, 24), max_tokens=12, priority=1, arrival_time=3.0))
    out, _ = step(s)
    assert out.req_ids == ["high", "mid"]
    # make them grow until the pool runs out: the victim is the highest priority value
    victims = []
    for _ in range(30):
        out, _ = step(s)
        if out.preempted_req_ids and not victims:
            assert [r.request_id for r in s.waiting] == ["mid", "low"]  # by priority, not by preemption
        victims += out.preempted_req_ids
        if not s.has_unfinished_requests():
            break
    assert victims and victims[0] == "mid"


def test_abort_frees_blocks_at_once():
    s = make()
    s.add_request(req("a", range(10)))
    s.add_request(req("w", range(10), max_tokens=8))
    s.config.max_num_seqs = 1
    step(s)
    assert s.kv.num_used_blocks == 3
    assert s.abort_request("a") and s.kv.num_used_blocks == 0
    assert s.abort_request("w") and not s.abort_request("w") and not s.abort_request("nope")
    assert not s.has_unfinished_requests()
    assert s.schedule().finished_req_ids == ["a", "w"]


def test_abort_between_schedule_and_update_is_skipped():
    s = make()
    s.add_request(req("a", range(10)))
    out = s.schedule()
    s.abort_request("a")
    assert s.update_from_output(out, [1]) == []
    assert s.kv.num_used_blocks == 0


def test_stop_token_ids_eos_and_min_tokens():
    s = make()
    s.add_request(req("e", range(4), eos_token_id=2, min_tokens=2))
    s.add_request(req("s", range(10, 14), stop_token_ids=[9]))
    out = s.schedule()
    upd = s.update_from_output(out, np.array([2, 9]))
    assert [r.status for r in upd] == [RequestStatus.RUNNING, RequestStatus.FINISHED_STOPPED]
    assert upd[1].stop_reason == 9 and upd[1].finish_reason == "stop"
    out = s.schedule()
    (e,) = s.update_from_output(out, [2])
    assert e.status == RequestStatus.FINISHED_STOPPED and e.stop_reason is None
    assert s.kv.num_used_blocks == 0


def test_external_finish_for_stop_strings():
    s = make()
    s.add_request(req("a", range(4)))
    step(s)
    assert s.finish_request("a", "stop", stop_reason="\n\n")
    assert s.kv.num_used_blocks == 0 and not s.has_unfinished_requests()
    assert s.num_running == 0


def test_max_model_len_finishes_with_length():
    s = make(max_model_len=12)
    s.add_request(req("a", range(10), max_tokens=100))
    _, upd = step(s)
    _, upd = step(s)
    assert upd[0].status == RequestStatus.FINISHED_LENGTH and upd[0].num_tokens == 12


def test_add_request_rejects_what_can_never_run():
    s = make(num_blocks=4, max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len"):
        s.add_request(req("a", range(65)))
    with pytest.raises(ValueError, match="KV blocks"):
        s.add_request(req("b", range(10), max_tokens=20))
    s.add_request(req("c", range(10), max_tokens=7))  # 16 tokens of K/V: 4 blocks
    with pytest.raises(ValueError, match="already exists"):
        s.add_request(req("c", range(3)))
    with pytest.raises(ValueError):
        Request("d", [])
    with pytest.raises(ValueError):
        SchedulerConfig(policy="lifo")


def test_update_checks_row_count_and_empty_schedule():
    s = make()
    out = s.schedule()
    assert out.is_empty and out.req_ids == [] and out.step_inputs.input_ids.shape == (0,)
    s.add_request(req("a", range(3)))
    out = s.schedule()
    with pytest.raises(ValueError, match="sampled tokens"):
        s.update_from_output(out, [1, 2])
