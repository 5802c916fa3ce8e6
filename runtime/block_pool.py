"""The KV cache's block pool: fixed-size blocks, reference counts, a prefix cache and an O(1) LRU free list.

The cache holds ``num_blocks`` blocks of ``block_size`` tokens. A block is *used* while a request
holds it (``ref_cnt > 0``; several requests share a block through a prefix hit or a fork) and *free*
otherwise. Every free block sits in one intrusive doubly linked list, the free queue::

    head -> [uncached b7] <-> [uncached b2] <-> [cached b4] <-> [cached b9] -> tail
            ^ handed out first                   least ... most recently freed ^

Allocation pops from the head. A block freed without cached content goes to the head (nothing is
lost by reusing it); a full block with cached content goes to the tail and stays findable until it
reaches the head and is handed out (evicted): the least recently freed cached block goes first. A
prefix hit on a free cached block takes it out of the middle of the queue in O(1).

Prefix caching. A full block's content is identified by its tokens *and* everything before them,
so its hash chains over the parent block's hash::

    block_hash[i] = hash_fn(block_hash[i - 1], tokens[i * bs : (i + 1) * bs])   (block_hash[-1] = 0)

The hash is only the dictionary key. A hit also requires the stored token ids to equal the looked-up
ones *and* the stored block's parent to be the block matched one level up (each cached block records
its parent's ``cache_id``, a number never reused), so two contents whose hashes collide, at any
level of the chain, never share a block. Several blocks may hold the same content (two requests
computed it in the same step); a lookup accepts any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

#: ``hash_fn(parent_hash, token_ids) -> int``: the chained block hash (any int; collisions are safe)
HashFn = Callable[[int, tuple[int, ...]], int]

ROOT_HASH = 0  # the "parent hash" of a sequence's first block
_ROOT_CACHE_ID = 0  # the "parent cache id" of a sequence's first block; real cache ids start at 1


def hash_block_tokens(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    """The default chained block hash: Python's tuple hash (deterministic for ints across processes)."""
    return hash((parent_hash, token_ids))


class KVCacheBlock:
    """One block of the cache, with its links in the free queue (intrusive list) and its cached content."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "token_ids", "cache_id", "parent_cache_id", "prev", "next")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        #: chained hash of the content; None while the block holds no cached content
        self.block_hash: int | None = None
        self.token_ids: tuple[int, ...] | None = None
        #: unique id of this cached content (0: not cached); a child records it as parent_cache_id
        self.cache_id = 0
        self.parent_cache_id = _ROOT_CACHE_ID
        self.prev: KVCacheBlock | None = None
        self.next: KVCacheBlock | None = None

    @property
    def is_cached(self) -> bool:
        return self.cache_id != 0

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}, cached={self.is_cached})"


class FreeBlockQueue:
    """Doubly linked list of the free blocks through their ``prev``/``next`` slots; every operation is O(1)."""

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)  # sentinels: no None checks in the hot paths
        self._tail = KVCacheBlock(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self.num_free = 0
        for b in blocks:
            self.append(b)

    def popleft(self) -> KVCacheBlock:
        b = self._head.next
        if b is self._tail:
            raise IndexError("no free block")
        self.remove(b)
        return b

    def remove(self, b: KVCacheBlock) -> None:
        prev, nxt = b.prev, b.next
        prev.next = nxt  # type: ignore[union-attr]
        nxt.prev = prev  # type: ignore[union-attr]
        b.prev = b.next = None
        self.num_free -= 1

    def append(self, b: KVCacheBlock) -> None:
        last = self._tail.prev
        last.next = b  # type: ignore[union-attr]
        b.prev = last
        b.next = self._tail
        self._tail.prev = b
        self.num_free += 1

    def appendleft(self, b: KVCacheBlock) -> None:
        first = self._head.next
        first.prev = b  # type: ignore[union-attr]
        b.next = first
        b.prev = self._head
        self._head.next = b
        self.num_free += 1

    def __iter__(self) -> Iterator[KVCacheBlock]:
        b = self._head.next
        while b is not self._tail:
            yield b
            b = b.next

    def block_ids(self) -> list[int]:
        """The free block ids, head (next handed out) first."""
        return [b.block_id for b in self]


class BlockPool:
    """``num_blocks`` ref-counted blocks, a free queue and the prefix cache (hash -> blocks with that hash)."""

    def __init__(self, num_blocks: int, *, enable_caching: bool = True, hash_fn: HashFn = hash_block_tokens) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.hash_fn = hash_fn
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        #: block hash -> {block_id: block} of every block with cached content (free or used)
        self.cached: dict[int, dict[int, KVCacheBlock]] = {}
        self._next_cache_id = 1
        self.num_evictions = 0

    # -- counts -----------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.free_queue.num_free

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    # -- allocation -------------------------------------------------------------------------------

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Take ``n`` blocks from the head of the free queue (evicting cached content), each with ref_cnt 1."""
        if n > self.free_queue.num_free:
            raise ValueError(f"asked for {n} blocks, {self.free_queue.num_free} free")
        out = []
        popleft = self.free_queue.popleft
        for _ in range(n):
            b = popleft()
            if b.cache_id:
                self._evict(b)
            b.ref_cnt = 1
            out.append(b)
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on blocks (prefix hits, forks); a free one leaves the free queue."""
        for b in blocks:
            if b.ref_cnt == 0:
                self.free_queue.remove(b)
            b.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the given order (pass a request's blocks tail first).

        A block whose count reaches 0 becomes free: at the tail of the queue if it holds cached
        content (evicted last, and blocks freed earlier in this call go before it), else at the head.
        """
        for b in blocks:
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                if b.cache_id:
                    self.free_queue.append(b)
                else:
                    self.free_queue.appendleft(b)
            elif b.ref_cnt < 0:
                raise AssertionError(f"block {b.block_id} freed more often than taken")

    # -- prefix cache -----------------------------------------------------------------------------

    def cache_block(
        self, block: KVCacheBlock, block_hash: int, token_ids: tuple[int, ...], parent: KVCacheBlock | None
    ) -> None:
        """Record that ``block`` holds the full block ``token_ids`` following ``parent``'s content (None: first)."""
        if not self.enable_caching or block.cache_id:
            return
        parent_id = _ROOT_CACHE_ID if parent is None else parent.cache_id
        if parent is not None and not parent_id:
            return  # parent content unknown: a child could never be reached
        block.block_hash = block_hash
        block.token_ids = token_ids
        block.parent_cache_id = parent_id
        block.cache_id = self._next_cache_id
        self._next_cache_id += 1
        bucket = self.cached.get(block_hash)
        if bucket is None:
            self.cached[block_hash] = {block.block_id: block}
        else:
            bucket[block.block_id] = block

    def find_cached_blocks(
        self, block_hashes: Sequence[int], token_ids: Sequence[int], block_size: int, max_blocks: int
    ) -> list[KVCacheBlock]:
        """The longest run of cached blocks holding ``token_ids``' first full blocks (at most ``max_blocks``).

        Takes no reference; the caller ``touch``es the blocks it keeps.
        """
        hits: list[KVCacheBlock] = []
        if not self.enable_caching:
            return hits
        parents: set[int] | tuple[int, ...] = (_ROOT_CACHE_ID,)
        cached = self.cached
        for i in range(min(max_blocks, len(block_hashes))):
            bucket = cached.get(block_hashes[i])
            if not bucket:
                break
            toks = tuple(token_ids[i * block_size : (i + 1) * block_size])
            found: KVCacheBlock | None = None
            next_parents: set[int] = set()
            for b in bucket.values():
                if b.parent_cache_id in parents and b.token_ids == toks:
                    if found is None:
                        found = b
                    next_parents.add(b.cache_id)
            if found is None:
                break
            hits.append(found)
            parents = next_parents
        return hits

    def _evict(self, b: KVCacheBlock) -> None:
        bucket = self.cached[b.block_hash]  # type: ignore[index]
        del bucket[b.block_id]
        if not bucket:
            del self.cached[b.block_hash]  # type: ignore[arg-type]
        b.block_hash = None
        b.token_ids = None
        b.cache_id = 0
        b.parent_cache_id = _ROOT_CACHE_ID
        self.num_evictions += 1

    def reset_prefix_cache(self) -> int:
        """Forget the content of every free cached block; returns how many. Used blocks keep theirs."""
        n = 0
        for b in list(self.free_queue):
            if b.cache_id:
                self._evict(b)
                n += 1
        return n
