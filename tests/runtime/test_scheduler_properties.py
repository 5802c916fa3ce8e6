"""Property tests (hypothesis, stateful): random add / fork / step / abort / finish on small pools.

Invariants checked after every rule:

- free + used == total blocks; the free queue holds exactly the blocks with ref_cnt 0; no
  negative ref counts; each block's ref_cnt is the number of requests holding it;
- the token budget and ``max_num_seqs`` hold in every step;
- every running request's blocks cover its computed tokens, and its block-table row lists them;
- the prefix-cache index only lists blocks with cached content;
- *what attention reads is right*: a fake KV cache records the token written to each slot (through
  ``slot_mapping``); after each step, every scheduled sequence's blocks hold its own tokens at every
  position up to ``seq_lens``. This is what makes prefix hits (also under a hash that collides all
  the time), forks and preemption sound;
- when every request has ended, no block is in use (cached free blocks count as free).

Decode steps (``plan_decode_steps``): all the steps' K/V writes run before any token is taken (as on the
GPU), step ``j``'s input being what step ``j - 1`` sampled; every step reads its rows' right contexts, rows
stop inside the steps (eos, ``max_tokens``, a stop string between steps), and the blocks they filled are
found by later requests with the right content.
"""

import numpy as np
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ingot.runtime.request import Request, RequestStatus
from ingot.runtime.scheduler import CacheConfig, Scheduler, SchedulerConfig

# prompts are a few of these chunks (block-aligned for block sizes 2 and 4) and a suffix: the same block
# content recurs after different prefixes, and prefixes are shared
CHUNKS = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]


def constant_hash(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    return 1  # every block collides with every other: only the verification separates them


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        block_size=st.sampled_from([2, 4]),
        num_blocks=st.integers(5, 16),
        budget=st.integers(3, 40),
        max_num_seqs=st.integers(1, 6),
        policy=st.sampled_from(["fcfs", "priority"]),
        threshold=st.sampled_from([0, 0, 5]),
        collide=st.booleans(),
        caching=st.sampled_from([True, True, False]),
    )
    def setup(self, block_size, num_blocks, budget, max_num_seqs, policy, threshold, collide, caching):
        self.cfg = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=32,
            long_prefill_token_threshold=threshold,
            policy=policy,
        )
        cache = CacheConfig(num_blocks, block_size, enable_prefix_caching=caching)
        if collide:
            cache.hash_fn = constant_hash
        self.s = Scheduler(self.cfg, cache)
        # fake cache: a slot holds the context its K/V depends on (the sequence's tokens up to it)
        self.kv_ctx: list[tuple[int, ...] | None] = [None] * (num_blocks * block_size)
        self.n = 0
        self.clock = 0.0

    def _ids(self) -> list[str]:
        return sorted(self.s.requests)

    @rule(
        chunks=st.lists(st.sampled_from(CHUNKS), max_size=3),
        suffix=st.lists(st.integers(0, 9), min_size=1, max_size=4),
        max_tokens=st.integers(1, 14),
        eos=st.sampled_from([None, 0]),
        priority=st.integers(0, 2),
    )
    def add(self, chunks, suffix, max_tokens, eos, priority):
        self.clock += 1
        r = Request(
            f"r{self.n}",
            sum(chunks, []) + suffix,
            max_tokens=max_tokens,
            eos_token_id=eos,
            priority=priority,
            arrival_time=self.clock,
        )
        self.n += 1
        try:
            self.s.add_request(r)
        except ValueError as e:
            assert "KV blocks" in str(e)  # could never fit in this small cache

    @precondition(lambda self: self.s.requests)
    @rule(data=st.data())
    def fork(self, data):
        parent = self.s.requests[data.draw(st.sampled_from(self._ids()))]
        self.clock += 1
        child = Request(f"r{self.n}", parent.prompt_token_ids, max_tokens=parent.max_tokens, arrival_time=self.clock)
        self.n += 1
        try:
            self.s.fork_request(parent.request_id, child)
        except ValueError:
            pass

    @rule(tokens=st.lists(st.integers(0, 9), min_size=64, max_size=64), repeat=st.integers(1, 3))
    def step(self, tokens, repeat=1):
        for k in range(repeat):
            self._step(tokens[k:] + tokens[:k])

    def _step(self, tokens):
        s = self.s
        out = s.schedule()
        si = out.step_inputs
        assert out.total_num_scheduled_tokens <= self.cfg.max_num_batched_tokens
        assert len(out.req_ids) <= self.cfg.max_num_seqs
        assert sum(out.num_scheduled_tokens.values()) == out.total_num_scheduled_tokens == len(si.input_ids)
        assert all(n > 0 for n in out.num_scheduled_tokens.values())
        for row, r in enumerate(out.requests):
            assert r.status == RequestStatus.RUNNING
            assert int(si.seq_lens[row]) == r.num_computed_tokens
        self._execute(si, [r.all_token_ids for r in out.requests])
        s.update_from_output(out, tokens[: len(out.req_ids)])
        if out.preempted_req_ids:
            event("preemption")
        if any(r.num_cached_tokens > 0 for r in out.requests if r.request_id in out.new_req_ids):
            event("prefix hit")

    def _execute(self, si, seqs, placeholders=False):
        """The step writes K/V (here: the context of the token) to its slots, then attention reads every
        sequence's context; ``seqs[row]``: the row's tokens (its input ids, unless ``placeholders``)."""
        bs = self.s.block_size
        qsl = si.query_start_loc.tolist()
        for row, seq in enumerate(seqs):
            for t in range(qsl[row], qsl[row + 1]):
                p = int(si.positions[t])
                assert placeholders or si.input_ids[t] == seq[p]
                self.kv_ctx[si.slot_mapping[t]] = tuple(seq[: p + 1])
        for row, seq in enumerate(seqs):
            L = int(si.seq_lens[row])
            pos = np.arange(L)
            slots = si.block_tables[row, pos // bs].astype(np.int64) * bs + pos % bs
            assert [self.kv_ctx[k] for k in slots] == [tuple(seq[: p + 1]) for p in range(L)], row

    @rule(tokens=st.lists(st.integers(0, 9), min_size=64, max_size=64), k=st.integers(2, 6), data=st.data())
    def decode_steps(self, tokens, k, data):
        s = self.s
        out = s.schedule()
        plan = s.plan_decode_steps(out, k)
        if plan is None:
            self._execute(out.step_inputs, [r.all_token_ids for r in out.requests])
            s.update_from_output(out, tokens[: len(out.req_ids)])
            return
        event("decode steps")
        reqs = out.requests
        assert 2 <= plan.num_steps <= k and not s.waiting_can_join()
        assert all(n == 1 for n in out.num_scheduled_tokens.values())
        sampled = [[tokens[(j * len(reqs) + row) % 64] for row in range(len(reqs))] for j in range(plan.num_steps)]
        # the executor: every step, each taking the previous step's ids, before the engine sees a token
        for j, si in enumerate(plan.step_inputs):
            self._execute(si, [list(r.all_token_ids) + [sampled[i][row] for i in range(j)]
                               for row, r in enumerate(reqs)], placeholders=j > 0)
        for j in range(plan.num_steps):
            for r in s.update_from_decode_step(plan, j, sampled[j]):
                if r.is_finished:
                    event("stopped inside decode steps")
                elif data.draw(st.integers(0, 7)) == 0:  # a stop string, found by the engine
                    s.finish_request(r.request_id, "stop", "</s>")
        for r in reqs:
            assert r.is_finished or r.num_computed_tokens == r.num_tokens - 1

    @precondition(lambda self: self.s.requests)
    @rule(data=st.data())
    def abort(self, data):
        rid = data.draw(st.sampled_from(self._ids()))
        used = self.s.kv.num_used_blocks
        assert self.s.abort_request(rid)
        assert self.s.get_request(rid) is None and self.s.kv.num_used_blocks <= used

    @precondition(lambda self: self.s.requests)
    @rule(data=st.data())
    def finish(self, data):
        rid = data.draw(st.sampled_from(self._ids()))
        assert self.s.finish_request(rid, "stop", stop_reason="</s>")

    @rule()
    def drain(self):
        """Run to completion (bounded), then everything must be free."""
        for _ in range(200):
            if not self.s.has_unfinished_requests():
                break
            self._step([1] * 64)
        assert not self.s.has_unfinished_requests()
        assert self.s.kv.num_used_blocks == 0
        assert not self.s.kv.req_blocks

    @invariant()
    def blocks_are_consistent(self):
        if not hasattr(self, "s"):
            return
        kv = self.s.kv
        pool = kv.pool
        refs = [0] * pool.num_blocks
        for blocks in kv.req_blocks.values():
            for b in blocks:
                refs[b.block_id] += 1
        assert [b.ref_cnt for b in pool.blocks] == refs
        free_ids = pool.free_queue.block_ids()
        assert len(free_ids) == pool.free_queue.num_free == len(set(free_ids))
        assert set(free_ids) == {i for i, n in enumerate(refs) if n == 0}
        assert pool.num_free_blocks + pool.num_used_blocks == pool.num_blocks
        for h, bucket in pool.cached.items():
            for bid, b in bucket.items():
                assert b.block_id == bid and b.is_cached and b.block_hash == h
        for b in pool.blocks:
            assert b.ref_cnt >= 0
            assert b.is_cached == (b.block_hash is not None and b.block_id in pool.cached.get(b.block_hash, {}))
        # only running requests hold blocks
        assert set(kv.req_blocks) <= set(self.s.requests)
        for rid, r in self.s.requests.items():
            assert not r.is_finished
            if r.status == RequestStatus.RUNNING:
                assert r in self.s.running
            blocks = kv.req_blocks.get(rid, [])
            if r.status != RequestStatus.RUNNING:
                assert not blocks
            assert len(blocks) * kv.block_size >= r.num_computed_tokens
            if blocks:
                assert kv.block_table[kv.row_of(rid), : len(blocks)].tolist() == [b.block_id for b in blocks]
            else:
                assert r.num_computed_tokens == 0
        assert len(self.s.running) <= self.cfg.max_num_seqs
        assert len(self.s.running) + len(self.s.waiting) == len(self.s.requests)

    def teardown(self):
        if not hasattr(self, "s"):
            return
        for rid in self._ids():
            self.s.abort_request(rid)
        assert self.s.kv.num_used_blocks == 0
        assert self.s.kv.num_free_blocks == self.s.kv.num_blocks


SchedulerMachine.TestCase.settings = settings(
    max_examples=250,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSchedulerProperties = SchedulerMachine.TestCase
