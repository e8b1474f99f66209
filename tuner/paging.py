"""A paged KV cache (issue 37): where a paged problem's keys and values live.

Serving engines keep K and V in fixed-size pages, ``k_pages`` / ``v_pages`` of shape
[num_pages, page_size, Hkv, D], and each sequence lists its pages in a block table
([B, max_pages] int32): sequence b's keys j*page_size .. (j+1)*page_size - 1 are rows 0 ..
page_size - 1 of page block_table[b, j] (vLLM, SGLang, FlashInfer, FA3's ``page_table``).

A paged problem (``Problem.page_size``) has one fixed layout of its pages, the same wherever it
is built (gate, timing, peers): the pages of all sequences in one pool, in a random order drawn
from the problem's text, and, as prefix caching makes them, shared pages: every odd sequence's
first page is sequence 0's first page (where both hold a whole page), so its first page_size
keys and values are sequence 0's. Table entries past a sequence's pages are 0 (a valid page:
a kernel that read them would read wrong keys, not fault). Rows of a sequence's last page past
its keys are zero (the buffers zero the pools once; kernels that load whole pages read them,
masked, and 0 x NaN would be NaN).

The inputs are generated dense (the logical [B, S_k, Hkv, D] or packed [total_k, Hkv, D] K and
V, which the references read) and mirrored into the pages (``PageLayout.copies``): first the
shared rows within the dense tensors, then every page from its rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

# Page sizes the kernel reads (rows per page): powers of two, at least one 8-row swizzle atom.
MIN_PAGE_SIZE = 8
MAX_PAGE_SIZE = 4096


def page_size_problem(page_size: int) -> str:
    """Why ``page_size`` cannot be a problem's page size ('' when it can)."""
    if page_size < MIN_PAGE_SIZE or page_size > MAX_PAGE_SIZE or page_size & (page_size - 1):
        return (f"the page size must be a power of two from {MIN_PAGE_SIZE} to {MAX_PAGE_SIZE} "
                f"rows (got {page_size}); serving engines use 16 to 256")
    return ""


@dataclass(frozen=True)
class PageCopy:
    """One page's rows into the pool: ``rows`` rows from dense row ``src_row`` (of the K or V
    tensor as ``as_fixed`` lays it out: b * S_k + key, or cu_seqlens_k[b] + key) to row 0 of
    page ``page``."""

    src_row: int
    page: int
    rows: int


@dataclass(frozen=True)
class PageLayout:
    """A paged problem's pages (module docstring)."""

    page_size: int
    num_pages: int
    block_table: np.ndarray  # [B, max_pages] int32
    # Dense rows copied over other dense rows first (src_row, dst_row, rows): a shared page's
    # keys are the first sequence's.
    shared: tuple[tuple[int, int, int], ...]
    copies: tuple[PageCopy, ...]

    @property
    def max_pages(self) -> int:
        return int(self.block_table.shape[1])


def page_layout(key_lengths: tuple[int, ...], key_starts: tuple[int, ...], page_size: int,
                name: str) -> PageLayout:
    """The layout of sequences with these key lengths, whose dense keys start at these rows;
    ``name`` (the problem's text) seeds the page order."""
    B = len(key_lengths)
    counts = [-(-k // page_size) for k in key_lengths]
    max_pages = max(1, max(counts))
    # Sequence b's table slot (b, 0) shares sequence 0's first page when b is odd and both hold
    # a whole page.
    shares = [b % 2 == 1 and key_lengths[b] >= page_size and key_lengths[0] >= page_size
              for b in range(B)]
    own = sum(counts) - sum(shares)
    num_pages = max(1, own)
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    order = np.random.default_rng(seed).permutation(num_pages).astype(np.int32)
    table = np.zeros((B, max_pages), dtype=np.int32)
    copies: list[PageCopy] = []
    shared: list[tuple[int, int, int]] = []
    nxt = 0
    for b in range(B):
        for j in range(counts[b]):
            if j == 0 and shares[b]:
                table[b, 0] = table[0, 0]
                shared.append((key_starts[0], key_starts[b], page_size))
                continue
            page = int(order[nxt])
            nxt += 1
            table[b, j] = page
            rows = min(page_size, key_lengths[b] - j * page_size)
            copies.append(PageCopy(key_starts[b] + j * page_size, page, rows))
    return PageLayout(page_size, num_pages, table, tuple(shared), tuple(copies))
