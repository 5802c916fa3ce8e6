"""The KV cache manager: which blocks each request holds, prefix-cache lookups, slot allocation, forks.

The scheduler talks to the cache only through this class and the opaque ``KVCacheBlocks`` it
returns; it never sees a block. For one request, the manager keeps its blocks in order (block ``i``
holds tokens ``[i * bs, (i + 1) * bs)``) and a row of a persistent ``int32`` block table
(``block_table[row, i]`` is the id of block ``i``), from which the scheduler gathers the step's
``block_tables`` and ``slot_mapping`` with numpy, without walking Python lists.

A request's tokens and its blocks, in a step that schedules ``num_new_tokens``::

    tokens: | computed (in cache)     | new (this step) | still to compute |
    blocks: [ b0 ][ b1 ][ b2 ][  b3  ...][ b4 ]           (allocated later)
             \\__ full, cached __/        ^ allocate_slots covers computed + new
             (may be shared with other requests: ref_cnt > 1)

Prefix caching: ``get_computed_blocks`` finds the longest run of cached full blocks holding a new
request's first tokens, but never the whole sequence (at least one token is computed, to get its
logits). ``cache_blocks`` makes a request's full blocks findable once their K/V is (being) written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .block_pool import ROOT_HASH, BlockPool, HashFn, KVCacheBlock, hash_block_tokens
from .request import Request


class KVCacheBlocks:
    """Blocks handed between the cache manager and the scheduler; opaque to the scheduler."""

    __slots__ = ("blocks",)

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def get_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]


_NO_BLOCKS = KVCacheBlocks([])


@dataclass
class PrefixCacheStats:
    """Prefix-cache counters, in tokens: each request counted once, when admitted (resumptions excluded)."""

    requests: int = 0
    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def num_blocks_for_memory(free_bytes: int, bytes_per_token: int, block_size: int = 16, fraction: float = 0.9) -> int:
    """How many blocks fit in ``fraction`` of ``free_bytes`` (``bytes_per_token`` from the artifact's KV spec)."""
    if bytes_per_token <= 0 or block_size <= 0:
        raise ValueError("bytes_per_token and block_size must be positive")
    return int(free_bytes * fraction) // (bytes_per_token * block_size)


class KVCacheManager:
    """Blocks per request over one ``BlockPool``.

    ``max_blocks_per_request`` (``cdiv(max_model_len, block_size)``) is the width of the block table.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        max_blocks_per_request: int | None = None,
        enable_prefix_caching: bool = True,
        hash_fn: HashFn = hash_block_tokens,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching, hash_fn=hash_fn)
        self.enable_prefix_caching = enable_prefix_caching
        self.max_blocks_per_request = max_blocks_per_request or num_blocks
        self.req_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # per request: its leading blocks already cached
        self.req_rows: dict[str, int] = {}
        self.block_table = np.zeros((16, self.max_blocks_per_request), np.int32)
        self._free_rows: list[int] = list(range(15, -1, -1))
        self.prefix_stats = PrefixCacheStats()

    # -- counts -----------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    # -- per-request state ------------------------------------------------------------------------

    def _new_row(self, request_id: str) -> list[KVCacheBlock]:
        if not self._free_rows:
            old = self.block_table.shape[0]
            self.block_table = np.concatenate([self.block_table, np.zeros_like(self.block_table)])
            self._free_rows = list(range(2 * old - 1, old - 1, -1))
        self.req_rows[request_id] = self._free_rows.pop()
        blocks: list[KVCacheBlock] = []
        self.req_blocks[request_id] = blocks
        self.num_cached_blocks[request_id] = 0
        return blocks

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(list(self.req_blocks.get(request_id, ())))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(request_id, ())]

    def row_of(self, request_id: str) -> int:
        """The request's row in ``block_table``."""
        return self.req_rows[request_id]

    # -- prefix cache -----------------------------------------------------------------------------

    def _ensure_block_hashes(self, request: Request, num_full_blocks: int) -> None:
        hashes = request.block_hashes
        if len(hashes) >= num_full_blocks:
            return
        bs = self.block_size
        tokens = request.all_token_ids
        hash_fn = self.pool.hash_fn
        parent = hashes[-1] if hashes else ROOT_HASH
        for i in range(len(hashes), num_full_blocks):
            parent = hash_fn(parent, tuple(tokens[i * bs : (i + 1) * bs]))
            hashes.append(parent)

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The cached blocks holding the request's longest cached prefix, and its length in tokens.

        Full blocks only, and never all of the request's tokens: the last one is always computed.
        Takes no reference (``allocate_slots`` does).
        """
        if not self.enable_prefix_caching:
            return _NO_BLOCKS, 0
        num_tokens = len(request.all_token_ids)
        max_blocks = (num_tokens - 1) // self.block_size
        self._ensure_block_hashes(request, max_blocks)
        hits = self.pool.find_cached_blocks(request.block_hashes, request.all_token_ids, self.block_size, max_blocks)
        return (KVCacheBlocks(hits) if hits else _NO_BLOCKS), len(hits) * self.block_size

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one request's lookup in the prefix-cache metrics (once per request, when it is admitted)."""
        st = self.prefix_stats
        st.requests += 1
        st.queries += num_tokens
        st.hits += num_hit_tokens

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Make the request's blocks that are full within its first ``num_tokens`` tokens findable."""
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        num_full = num_tokens // self.block_size
        done = self.num_cached_blocks[rid]
        if num_full <= done:
            return
        self._ensure_block_hashes(request, num_full)
        blocks = self.req_blocks[rid]
        bs = self.block_size
        tokens = request.all_token_ids
        hashes = request.block_hashes
        cache_block = self.pool.cache_block
        for i in range(done, num_full):
            blk = blocks[i]
            if not blk.cache_id:
                cache_block(blk, hashes[i], tuple(tokens[i * bs : (i + 1) * bs]), blocks[i - 1] if i else None)
        self.num_cached_blocks[rid] = num_full

    # -- allocation -------------------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_new_computed_tokens: int = 0,
    ) -> KVCacheBlocks | None:
        """Make the request's blocks cover its computed tokens, ``new_computed_blocks`` and ``num_new_tokens`` more.

        ``new_computed_blocks`` (from ``get_computed_blocks``, for a request holding no blocks yet)
        are taken by reference. Returns the newly allocated blocks, or None, changing nothing, when
        too few blocks are free.
        """
        rid = request.request_id
        blocks = self.req_blocks.get(rid)
        hit = new_computed_blocks.blocks if new_computed_blocks is not None else ()
        num_total = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_held = 0 if blocks is None else len(blocks)
        num_needed = -(-num_total // self.block_size) - num_held - len(hit)
        if num_needed <= 0 and not hit:
            return _NO_BLOCKS
        if num_held + len(hit) + max(num_needed, 0) > self.max_blocks_per_request:
            raise ValueError(f"request {rid!r} needs more than {self.max_blocks_per_request} blocks")
        # hit blocks that are free leave the free queue when taken: they do not count as available
        num_free_hits = sum(1 for b in hit if b.ref_cnt == 0)
        if num_needed > self.pool.num_free_blocks - num_free_hits:
            return None
        if blocks is None:
            blocks = self._new_row(rid)
        row = self.block_table[self.req_rows[rid]]
        if hit:
            self.pool.touch(hit)
            start = len(blocks)
            blocks.extend(hit)
            row[start : len(blocks)] = [b.block_id for b in hit]
            self.num_cached_blocks[rid] = len(blocks)
        if num_needed <= 0:
            return _NO_BLOCKS
        new = self.pool.get_new_blocks(num_needed)
        start = len(blocks)
        blocks.extend(new)
        if num_needed == 1:
            row[start] = new[0].block_id
        else:
            row[start : len(blocks)] = [b.block_id for b in new]
        return KVCacheBlocks(new)

    def fork(self, parent: Request, child: Request) -> int:
        """Give ``child`` (same leading tokens, holding no blocks) a reference on ``parent``'s full computed blocks.

        Shares the blocks covering ``min(parent.num_computed_tokens, child.num_tokens - 1)`` tokens,
        rounded down to full blocks (a partly filled block is never shared: both would write it).
        Returns the number of tokens shared; the caller sets ``child.num_computed_tokens`` to it.
        """
        if child.request_id in self.req_blocks:
            raise ValueError(f"request {child.request_id!r} already holds blocks")
        pblocks = self.req_blocks.get(parent.request_id, [])
        n_tok = min(parent.num_computed_tokens, len(child.all_token_ids) - 1)
        n_blocks = min(n_tok // self.block_size, len(pblocks))
        if child.all_token_ids[: n_blocks * self.block_size] != parent.all_token_ids[: n_blocks * self.block_size]:
            raise ValueError("fork: the child's tokens do not start with the shared tokens")
        if n_blocks == 0:
            return 0
        shared = pblocks[:n_blocks]
        self.pool.touch(shared)
        blocks = self._new_row(child.request_id)
        blocks.extend(shared)
        self.block_table[self.req_rows[child.request_id], :n_blocks] = [b.block_id for b in shared]
        self.num_cached_blocks[child.request_id] = min(n_blocks, self.num_cached_blocks[parent.request_id])
        if len(parent.block_hashes) >= n_blocks and not child.block_hashes:
            child.block_hashes = parent.block_hashes[:n_blocks]
        return n_blocks * self.block_size

    def free(self, request: Request) -> None:
        """Drop the request's references on its blocks (tail first: its last blocks are evicted first)."""
        rid = request.request_id
        blocks = self.req_blocks.pop(rid, None)
        if blocks is None:
            return
        self.pool.free_blocks(reversed(blocks))
        del self.num_cached_blocks[rid]
        self._free_rows.append(self.req_rows.pop(rid))

    def reset_prefix_cache(self) -> int:
        return self.pool.reset_prefix_cache()
