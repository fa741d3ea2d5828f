"""Batched decode attention over the paged KV cache in plain torch (the CPU path of every step).

`reference.paged_attention` handles any mix of prefill and decode and rebuilds everything per
layer. The decode rows of a step have one query each and the same block tables in every layer,
so here the per-step work is done once (`plan_step` / `plan_decode`: which rows decode, the
flat block index and the padding mask of each group) and each layer runs, per group, four ops:

1. one `index_select` of K and V together (`[2, n * max_blocks, ...]`, a single copy);
2. views to `[n, kv_heads, L, head_dim]`;
3. one `scaled_dot_product_attention` where the query heads sharing a KV head are that head's
   queries (`[n, kv_heads, group, head_dim]`): grouped-query attention without repeating K/V;
4. a view back to `[n, num_heads, head_dim]` (query head h uses KV head h // group, as in HF).

Groups: a padded batch costs what its longest context costs, times its rows. One long chat
among short ones would make every row pay for it (measured: a 23rd sequence of ~770 tokens
among 22 of ~200 doubled a step), so sequences are split, longest first, into groups whose
padded size stays within `1 + max_waste` of what they hold (at most `max_groups` groups; the
last takes the rest). When the whole batch is within that bound it is one group in its own
order, with no index ops at all.

With `native` plans (the engine's default on CPU, `TorchAttentionBackend.native_decode`) a
float32 cache skips the groups: the C kernel of `weir.kernels.cpu_decode_attention` reads each row's
blocks in place, one call per layer; the groups stay for other dtypes and where no compiler is.

Mixed steps (decodes and prefill chunks, `mixed_attention`): the decode rows go through the
groups above, the prefill chunks one sequence at a time through `weir.kernels.prefill_attention`
(the cached prefix and the chunk apart, merged by their log-sum-exps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from weir.kernels import cpu_decode_attention, prefill_attention, reference

MAX_WASTE = 0.5  # padded slots allowed per real slot in one group
MAX_GROUPS = 8  # one gather + one SDPA per group and layer: bounded


@dataclass(frozen=True)
class DecodeGroup:
    """Sequences attended in one padded batch."""

    rows: torch.Tensor | None  # [n] int64: which of the plan's sequences; None: all, in order
    block_index: torch.Tensor  # [n * max_blocks] int64, short rows padded as their table is (block 0)
    mask: torch.Tensor | None  # [n, 1, 1, padded_len] bool; None when no row is padded
    num_seqs: int
    padded_len: int  # max_blocks * block_size


@dataclass(frozen=True)
class DecodePlan:
    """What every layer of one step shares for its decode rows."""

    groups: tuple[DecodeGroup, ...]
    num_seqs: int
    # The C kernel's view (kernels/cpu_decode_attention.py), which then replaces the groups'
    # gathers and SDPA calls on a float32 CPU cache; None where it is off or unavailable.
    native: cpu_decode_attention.NativePlan | None = None


def _group_rows(blocks: Sequence[int], max_waste: float, max_groups: int) -> list[list[int]]:
    """Row indices split longest first so each group's padded size is within bound."""
    order = sorted(range(len(blocks)), key=lambda i: -blocks[i])
    groups: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i in order:
        if current and len(groups) < max_groups - 1:
            widest = blocks[current[0]]
            if (len(current) + 1) * widest > (1 + max_waste) * (held + blocks[i]):
                groups.append(current)
                current, held = [], 0
        current.append(i)
        held += blocks[i]
    groups.append(current)
    return groups


def _make_group(
    block_tables: torch.Tensor, seq_lens: Sequence[int], rows: list[int] | None, block_size: int
) -> DecodeGroup:
    lens = list(seq_lens) if rows is None else [seq_lens[i] for i in rows]
    max_blocks = (max(lens) + block_size - 1) // block_size
    padded_len = max_blocks * block_size
    device = block_tables.device
    row_index = None if rows is None else torch.tensor(rows, dtype=torch.long, device=device)
    table = block_tables if row_index is None else block_tables.index_select(0, row_index)
    index = table[:, :max_blocks].reshape(-1).long()  # [n * max_blocks]
    mask = None
    if min(lens) < padded_len:
        positions = torch.arange(padded_len, device=device)
        mask = (positions[None, :] < torch.tensor(lens, device=device)[:, None])[:, None, None, :]
    return DecodeGroup(row_index, index, mask, len(lens), padded_len)


def plan_decode(
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: Sequence[int],  # context length of each sequence, this step's token included
    block_size: int,
    max_waste: float = MAX_WASTE,
    max_groups: int = MAX_GROUPS,
    native: bool = False,
) -> DecodePlan:
    """The groups, block indices and padding masks of a step's decode rows (one query each);
    `native`: also the C kernel's view, where the kernel is available on this device."""
    num_seqs = len(seq_lens)
    if num_seqs == 0 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows for {num_seqs} sequences")
    if min(seq_lens) < 1:
        raise ValueError(f"every sequence needs a context of >= 1 token, got {min(seq_lens)}")
    blocks = [(n + block_size - 1) // block_size for n in seq_lens]
    if max(blocks) > block_tables.shape[1]:
        raise ValueError(
            f"a context of {max(seq_lens)} tokens needs {max(blocks)} blocks, the table has {block_tables.shape[1]}"
        )
    native_plan = None
    if native and block_tables.device.type == "cpu" and cpu_decode_attention.available():
        native_plan = cpu_decode_attention.plan(block_tables, seq_lens, block_size)
    if num_seqs * max(blocks) <= (1 + max_waste) * sum(blocks):
        return DecodePlan((_make_group(block_tables, seq_lens, None, block_size),), num_seqs, native_plan)
    groups = _group_rows(blocks, max_waste, max_groups)
    return DecodePlan(
        tuple(_make_group(block_tables, seq_lens, g, block_size) for g in groups), num_seqs, native_plan
    )


def _attend(query: torch.Tensor, kv_cache: torch.Tensor, g: DecodeGroup, scale: float) -> torch.Tensor:
    _, _, _, num_kv_heads, head_dim = kv_cache.shape
    n, num_heads, _ = query.shape
    kv = kv_cache.index_select(1, g.block_index)  # [2, n * max_blocks, block_size, kv_heads, head_dim]
    kv = kv.view(2, n, g.padded_len, num_kv_heads, head_dim).transpose(2, 3)  # [2, n, kvh, L, hd]
    q = query.to(kv.dtype).view(n, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=g.mask, scale=scale)
    return out.reshape(n, num_heads, head_dim).to(query.dtype)


def decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim], one query per sequence
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    plan: DecodePlan,
    scale: float,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Each sequence's query attends over its whole paged context (see the module docstring)."""
    _, _, _, num_kv_heads, head_dim = kv_cache.shape
    num_seqs, num_heads, q_dim = query.shape
    if num_seqs != plan.num_seqs or q_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"query {tuple(query.shape)} does not fit {plan.num_seqs} sequences of "
            f"{num_kv_heads} KV heads of {head_dim}"
        )
    if (
        plan.native is not None
        and query.dtype == kv_cache.dtype
        and cpu_decode_attention.supports(kv_cache, num_heads)
    ):
        return cpu_decode_attention.decode_attention(query, kv_cache, plan.native, scale)
    if len(plan.groups) == 1 and plan.groups[0].rows is None:
        return _attend(query, kv_cache, plan.groups[0], scale)
    out = torch.empty_like(query)
    for g in plan.groups:
        assert g.rows is not None
        out.index_copy_(0, g.rows, _attend(query.index_select(0, g.rows), kv_cache, g, scale))
    return out


@dataclass(frozen=True)
class StepPlan:
    """A mixed step's decode rows (their plan) and its prefill rows."""

    decode: DecodePlan | None  # None: no decode row
    decode_tokens: slice | torch.Tensor  # where the decode rows' queries sit in the token dim
    prefill_rows: tuple[int, ...]


def plan_step(
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc: Sequence[int],  # num_seqs + 1 offsets into the token dim
    seq_lens: Sequence[int],
    block_size: int,
    native: bool = False,
) -> StepPlan:
    """Split a step into decode rows (one new token) and prefill rows, and plan the decodes
    (`native`: with the C kernel's view where it is available)."""
    decode_rows = [i for i in range(len(seq_lens)) if query_start_loc[i + 1] - query_start_loc[i] == 1]
    prefill_rows = tuple(i for i in range(len(seq_lens)) if query_start_loc[i + 1] - query_start_loc[i] > 1)
    if not decode_rows:
        return StepPlan(None, slice(0, 0), prefill_rows)
    starts = [query_start_loc[i] for i in decode_rows]
    n = len(decode_rows)
    tokens: slice | torch.Tensor
    if decode_rows == list(range(n)) and starts == list(range(n)):
        tables, tokens = block_tables[:n], slice(0, n)  # the scheduler puts decodes first
    else:
        rows = torch.tensor(decode_rows, dtype=torch.long, device=block_tables.device)
        tables = block_tables.index_select(0, rows)
        tokens = torch.tensor(starts, dtype=torch.long, device=block_tables.device)
    decode = plan_decode(tables, [seq_lens[i] for i in decode_rows], block_size, native=native)
    return StepPlan(decode, tokens, prefill_rows)


def mixed_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: Sequence[int],
    seq_lens: Sequence[int],
    plan: StepPlan,
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Any step: decode rows through the plan's groups, prefill chunks one sequence at a time."""
    out = torch.empty_like(query)
    if plan.decode is not None:
        tokens = plan.decode_tokens
        if isinstance(tokens, slice):
            out[tokens] = decode_attention(query[tokens], kv_cache, plan.decode, scale)
        else:
            out.index_copy_(
                0, tokens, decode_attention(query.index_select(0, tokens), kv_cache, plan.decode, scale)
            )
    reference.prefill_attention_into(
        out,
        query,
        kv_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        plan.prefill_rows,
        scale,
        prefill_attention.best_chunk_attention(),
    )
    return out
