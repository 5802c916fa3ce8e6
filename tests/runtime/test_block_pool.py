"""Block pool and KV cache manager: ref counts, the LRU free queue, prefix caching with token verification, forks."""

import pytest

from ingot.runtime.block_pool import BlockPool, FreeBlockQueue, KVCacheBlock, hash_block_tokens
from ingot.runtime.kv_cache import KVCacheManager, num_blocks_for_memory
from ingot.runtime.request import Request

BS = 4


def colliding_hash(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    """Every block of every sequence gets the same hash: only the token/parent verification separates them."""
    return 7


def req(rid: str, tokens: list[int], **kw) -> Request:
    return Request(rid, tokens, max_tokens=kw.pop("max_tokens", 8), **kw)


def computed(mgr: KVCacheManager, r: Request, n: int) -> None:
    """Allocate and 'compute' n more tokens of r, publishing its full blocks like the scheduler does."""
    hit, num_hit = (None, 0)
    if r.num_computed_tokens == 0 and r.request_id not in mgr.req_blocks:
        hit, num_hit = mgr.get_computed_blocks(r)
    assert mgr.allocate_slots(r, n, hit, num_hit) is not None
    r.num_computed_tokens += num_hit + n
    mgr.cache_blocks(r, r.num_computed_tokens)


# -- free queue ---------------------------------------------------------------------------------------


def test_free_queue_is_an_o1_linked_list():
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    assert q.block_ids() == [0, 1, 2, 3, 4] and q.num_free == 5
    q.remove(blocks[2])
    assert q.block_ids() == [0, 1, 3, 4] and q.num_free == 4
    assert q.popleft() is blocks[0]
    q.append(blocks[0])
    q.appendleft(blocks[2])
    assert q.block_ids() == [2, 1, 3, 4, 0]
    for _ in range(5):
        q.popleft()
    assert q.num_free == 0 and q.block_ids() == []
    with pytest.raises(IndexError):
        q.popleft()


# -- pool -----------------------------------------------------------------------------------------------


def test_ref_counts_and_counts():
    pool = BlockPool(6)
    a = pool.get_new_blocks(4)
    assert [b.ref_cnt for b in a] == [1, 1, 1, 1]
    assert pool.num_used_blocks == 4 and pool.num_free_blocks == 2
    pool.touch(a[:2])
    assert [b.ref_cnt for b in a] == [2, 2, 1, 1]
    pool.free_blocks(a)
    assert pool.num_used_blocks == 2
    pool.free_blocks(a[:2])
    assert pool.num_used_blocks == 0 and pool.num_free_blocks == 6
    with pytest.raises(AssertionError, match="freed more often"):
        pool.free_blocks(a[:1])
    with pytest.raises(ValueError):
        pool.get_new_blocks(7)


def test_lru_eviction_least_recently_freed_first():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(4)
    parent = None
    for i, b in enumerate(blocks):
        pool.cache_block(b, 100 + i, (i,), parent)
        parent = b
    # freed in the order 2, 0, 3, 1: the queue keeps that order, evicting 2 first
    for i in (2, 0, 3, 1):
        pool.free_blocks([blocks[i]])
    assert pool.free_queue.block_ids() == [2, 0, 3, 1]
    (b,) = pool.get_new_blocks(1)
    assert b.block_id == 2 and not b.is_cached and 102 not in pool.cached
    assert pool.num_evictions == 1
    # a hit on a free cached block takes it out of the middle of the queue
    pool.touch([blocks[3]])
    assert pool.free_queue.block_ids() == [0, 1]
    assert blocks[3].is_cached


def test_uncached_blocks_are_reused_before_cached_ones():
    pool = BlockPool(3)
    a, b, c = pool.get_new_blocks(3)
    pool.cache_block(a, 1, (1,), None)
    pool.free_blocks([a])  # cached: tail
    pool.free_blocks([b])  # uncached: head
    pool.free_blocks([c])
    assert pool.free_queue.block_ids() == [c.block_id, b.block_id, a.block_id]


def test_reset_prefix_cache_forgets_free_blocks_only():
    pool = BlockPool(2)
    a, b = pool.get_new_blocks(2)
    pool.cache_block(a, 1, (1,), None)
    pool.cache_block(b, 2, (2,), a)
    pool.free_blocks([b])
    assert pool.reset_prefix_cache() == 1
    assert a.is_cached and not b.is_cached


# -- prefix cache ------------------------------------------------------------------------------------------


def test_prefix_hit_full_blocks_never_the_whole_prompt():
    mgr = KVCacheManager(16, BS)
    a = req("a", list(range(12)))  # exactly 3 blocks
    computed(mgr, a, 12)
    b = req("b", list(range(12)))
    blocks, n = mgr.get_computed_blocks(b)
    assert n == 8  # the last block is recomputed: its last token needs logits
    assert blocks.get_block_ids() == mgr.get_block_ids("a")[:2]
    c = req("c", list(range(10)) + [99, 98, 97])
    assert mgr.get_computed_blocks(c)[1] == 8
    d = req("d", [0, 1, 2, 9] + list(range(4, 12)))  # differs in block 0: nothing
    assert mgr.get_computed_blocks(d)[1] == 0


def test_chained_hash_same_block_elsewhere_is_no_hit():
    mgr = KVCacheManager(16, BS)
    computed(mgr, req("a", [1, 2, 3, 4, 5, 6, 7, 8, 0]), 9)
    # block [5 6 7 8] cached after [1 2 3 4]; after [9 9 9 9] it is different content
    assert mgr.get_computed_blocks(req("b", [9, 9, 9, 9, 5, 6, 7, 8, 0]))[1] == 0


@pytest.mark.parametrize("hash_fn", [hash_block_tokens, colliding_hash])
def test_forced_hash_collision_never_gives_a_wrong_block(hash_fn):
    mgr = KVCacheManager(32, BS, hash_fn=hash_fn)
    x, y, z = [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]
    a = req("a", x + y + [0])
    computed(mgr, a, 9)
    b = req("b", z + [0])
    computed(mgr, b, 5)
    if hash_fn is colliding_hash:
        assert len(mgr.pool.cached[7]) == 3  # x, x+y and z all under one hash
    # [z][y]: block 0 is b's, block 1 (y after z) must not be a's y-after-x block
    c = req("c", z + y + [0])
    blocks, n = mgr.get_computed_blocks(c)
    assert n == 4 and blocks.get_block_ids() == mgr.get_block_ids("b")[:1]
    # same hash, different tokens: no hit
    assert mgr.get_computed_blocks(req("d", [4, 4, 4, 4, 0]))[1] == 0
    # the genuine content still hits, through the right chain
    e = req("e", x + y + [5])
    blocks, n = mgr.get_computed_blocks(e)
    assert n == 8 and blocks.get_block_ids() == mgr.get_block_ids("a")[:2]


def test_free_tail_first_then_eviction_keeps_the_prefix_longest():
    mgr = KVCacheManager(4, BS)
    a = req("a", list(range(9)))
    computed(mgr, a, 9)  # blocks 0, 1 full and cached; block 2 partial
    mgr.free(a)
    # the uncached partial block goes to the head; the full ones to the tail, last block first
    assert mgr.pool.free_queue.block_ids() == [2, 3, 1, 0]
    computed(mgr, req("b", [50] * 12), 12)  # takes 2, 3 and evicts 1
    assert mgr.get_computed_blocks(req("c", list(range(9))))[1] == 4


def test_evicted_parent_orphans_its_children_safely():
    mgr = KVCacheManager(4, BS)
    a = req("a", list(range(9)))
    computed(mgr, a, 9)
    blocks = list(mgr.req_blocks["a"])
    mgr.free(a)
    mgr.pool.touch(blocks[:2])
    mgr.pool.free_blocks(blocks[:2])  # parent freed before child: the parent is evicted first
    computed(mgr, req("b", [50] * 8), 8)  # evicts nothing cached: blocks 2, 3
    computed(mgr, req("x", [60] * 3), 3)  # evicts block 0 (the parent)
    assert not blocks[0].is_cached and blocks[1].is_cached
    # the content of block 0 cached again elsewhere: block 1's parent is gone, so no hit past block 0
    assert mgr.get_computed_blocks(req("c", list(range(9))))[1] == 0


def test_allocate_slots_all_or_nothing():
    mgr = KVCacheManager(4, BS)
    a = req("a", list(range(12)))
    assert mgr.allocate_slots(a, 12) is not None  # 3 blocks
    b = req("b", list(range(100, 108)))
    assert mgr.allocate_slots(b, 8) is None  # needs 2, 1 free
    assert mgr.num_free_blocks == 1 and "b" not in mgr.req_blocks
    assert len(mgr.allocate_slots(b, 4)) == 1
    assert mgr.num_free_blocks == 0


def test_free_cached_hit_blocks_do_not_count_as_available():
    mgr = KVCacheManager(3, BS, max_blocks_per_request=8)
    a = req("a", list(range(9)))
    computed(mgr, a, 9)
    mgr.free(a)
    assert mgr.num_free_blocks == 3
    b = req("b", list(range(8)) + [1, 2, 3, 4, 5])  # hits 2 free cached blocks, needs 2 more
    hit, n = mgr.get_computed_blocks(b)
    assert n == 8
    assert mgr.allocate_slots(b, 5, hit, n) is None
    assert mgr.num_free_blocks == 3 and all(blk.ref_cnt == 0 for blk in hit.blocks)
    assert mgr.allocate_slots(b, 4, hit, n) is not None
    assert [blk.ref_cnt for blk in hit.blocks] == [1, 1]


def test_block_table_rows_follow_blocks():
    mgr = KVCacheManager(8, BS, max_blocks_per_request=4)
    a = req("a", list(range(10)))
    mgr.allocate_slots(a, 10)
    row = mgr.block_table[mgr.row_of("a")]
    assert row[:3].tolist() == mgr.get_block_ids("a")
    with pytest.raises(ValueError, match="more than 4 blocks"):
        mgr.allocate_slots(a, 20)


def test_many_requests_grow_the_block_table():
    mgr = KVCacheManager(64, BS)
    rs = [req(f"r{i}", [i]) for i in range(40)]
    for r in rs:
        mgr.allocate_slots(r, 1)
    assert mgr.block_table.shape[0] >= 40
    assert sorted(mgr.req_rows.values()) == list(range(40))
    for r in rs:
        assert mgr.block_table[mgr.row_of(r.request_id), 0] == mgr.get_block_ids(r.request_id)[0]


def test_fork_shares_full_blocks_by_reference():
    mgr = KVCacheManager(16, BS, enable_prefix_caching=False)
    p = req("p", list(range(10)))
    computed(mgr, p, 10)
    c = req("c", list(range(10)))
    shared = mgr.fork(p, c)
    assert shared == 8  # full blocks only; the partial third block is not shared
    assert mgr.get_block_ids("c") == mgr.get_block_ids("p")[:2]
    assert [b.ref_cnt for b in mgr.req_blocks["p"]] == [2, 2, 1]
    mgr.free(p)
    assert [b.ref_cnt for b in mgr.req_blocks["c"]] == [1, 1]
    assert mgr.num_used_blocks == 2
    mgr.free(c)
    assert mgr.num_used_blocks == 0
    with pytest.raises(ValueError, match="do not start"):
        q = req("q", list(range(9)))
        computed(mgr, q, 9)
        mgr.fork(q, req("d", [5] * 9))


def test_prefix_stats_and_memory_sizing():
    mgr = KVCacheManager(16, BS)
    mgr.record_prefix_lookup(10, 8)
    mgr.record_prefix_lookup(10, 0)
    assert mgr.prefix_stats.hit_rate == pytest.approx(0.4)
    assert num_blocks_for_memory(1 << 20, bytes_per_token=1024, block_size=16, fraction=1.0) == 64
