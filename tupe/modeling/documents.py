"""Positions and documents: what a forward pass given `position_ids` (or document boundaries) runs with.

`Positions` is what a scheme reads instead of `0..n-1` and what the kernels keep attention inside; `DocumentRows`
lays packed documents out one per row so that each is attended as if alone (`document_attention`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class Positions:
    """Positions given as data (`position_ids`) and the documents of each row: the one document object of a
    forward pass, built once (`build_positions`) from `position_ids`, `seq_idx` or `cu_seq_lens_q`. What a scheme
    reads instead of `0..n-1`, what the kernels keep attention inside (each converts it to what it needs: a
    block-diagonal mask, `rows` for the length groups, a flex `BlockMask`), and what the heads read documents from.

    - ids (b, n) long: each token's position (`position_ids`); a document's first token has position 0.
    - documents (b, n) long or None: each token's document, numbered from 0 in each row (None: one document per
      row). A document is a run of tokens that starts where `position_ids` restart at 0 (or where explicit
      boundaries, `cu_seq_lens_q` / `seq_idx`, say); no token attends outside its own document.
    - real (b, n) bool or None: the tokens that are not padding (`attention_mask`); None: no padding.
    - starts (b, n) bool: each document's first token (column 0 always).
    - lengths, padded: per document (row after row, in reading order), its tokens and its padded tokens, read on
      the host once when the object is built (None while tracing: nothing is read on the host then);
      `cu_seqlens` and `max_length` follow from them. zero_based: every document's positions are 0..m-1.

    Integer data, no gradient.
    """

    def __init__(
        self,
        ids: torch.Tensor,
        documents: torch.Tensor | None = None,
        real: torch.Tensor | None = None,
        *,
        starts: torch.Tensor | None = None,
        lengths: tuple[int, ...] | None = None,
        padded: tuple[int, ...] | None = None,
        zero_based: bool = False,
    ):
        self.ids = ids
        self.documents = documents
        self.real = real
        self.starts = starts
        self.lengths = lengths
        self.padded = padded
        self.zero_based = zero_based
        self._rows: dict[torch.dtype, DocumentRows | None] = {}

    @property
    def cu_seqlens(self) -> torch.Tensor | None:
        """(documents + 1,) int32: `[0, l_1, l_1 + l_2, ...]` over the flattened b * n tokens (a variable-length
        kernel's input), or None while tracing."""
        if self.lengths is None:
            return None
        edges = [0]
        for length in self.lengths:
            edges.append(edges[-1] + length)
        return torch.tensor(edges, dtype=torch.int32, device=self.ids.device)

    @property
    def max_length(self) -> int | None:
        """The longest document (tokens), or None while tracing."""
        return None if self.lengths is None else max(self.lengths)

    def rows(self, dtype: torch.dtype) -> DocumentRows | None:
        """The documents laid out one per row in length groups (`DocumentRows`), built once per dtype from the
        host values, or None where a document's positions are not 0..m-1 or while tracing."""
        if dtype not in self._rows:
            ready = self.lengths is not None and self.zero_based
            self._rows[dtype] = DocumentRows.of(self, dtype) if ready else None
        return self._rows[dtype]

    def offsets(self) -> torch.Tensor:
        """(b, n, n) `[i, j] = p_j - p_i` (key minus query), the relative positions of every pair."""
        return self.ids[:, None, :] - self.ids[:, :, None]

    def first(self) -> torch.Tensor:
        """(b, n) bool: tokens at position 0, a document's first token ([CLS], where TUPE's reset applies)."""
        return self.ids == 0

    def document_lengths(self) -> torch.Tensor:
        """(b, n) long: for each token, 1 + the largest position of a real (not padded) token of its document:
        the document's length when its positions are 0..m-1, whatever padding follows it."""
        ids = self.ids if self.real is None else self.ids.masked_fill(~self.real, -1)
        if self.documents is None:
            return (ids.amax(dim=1, keepdim=True) + 1).expand_as(ids)
        largest = torch.full_like(ids, -1).scatter_reduce(1, self.documents, ids, "amax", include_self=False)
        return largest.gather(1, self.documents) + 1


def document_starts(
    shape: tuple[int, int],
    device: torch.device,
    position_ids: torch.Tensor | None,
    cu_seq_lens_q: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """((b, n) bool, True on each document's first token (column 0 always), or None without `position_ids` or
    explicit boundaries; the (2,) bool checks of `cu_seq_lens_q`, read on the host with the rest, or None).
    Boundaries: `seq_idx` (b, n) segment ids (a new document where the id changes), else `cu_seq_lens_q` (the
    cumulative lengths `[0, l_1, l_1 + l_2, ..., n]` of one row, as transformers'
    `DataCollatorWithFlattening(return_flash_attn_kwargs=True)` writes), else where `position_ids` restart at 0."""
    b, n = shape
    if seq_idx is not None:
        if tuple(seq_idx.shape) != (b, n):
            raise ValueError(f"seq_idx has shape {tuple(seq_idx.shape)}; expected (batch, length) = {(b, n)}")
        seq_idx = seq_idx.to(device)
        starts = torch.ones(b, n, dtype=torch.bool, device=device)
        starts[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
        return starts, None
    if cu_seq_lens_q is not None:
        lengths = cu_seq_lens_q.reshape(-1).to(device=device, dtype=torch.long)
        if b != 1 or lengths.numel() < 2:
            raise ValueError(_cu_refusal(lengths, b, n))
        checks = torch.stack([(lengths[0] == 0) & (lengths[-1] == n), (lengths[1:] > lengths[:-1]).all()])
        starts = torch.zeros(1, n, dtype=torch.bool, device=device)
        starts[0, lengths[:-1].clamp(0, n - 1)] = True  # checked (`checks`) before anything reads it
        return starts, checks
    if position_ids is None:
        return None, None
    starts = position_ids == 0
    starts[:, 0] = True
    return starts, None


def _cu_refusal(lengths: torch.Tensor, b: int, n: int) -> str:
    return (
        f"cu_seq_lens_q {lengths.tolist()} does not describe the documents of one row of length {n} "
        f"(batch {b}): expected [0, ..., {n}] for a batch of one flattened row"
    )


def build_positions(
    shape: tuple[int, int],
    device: torch.device,
    position_ids: torch.Tensor | None,
    cu_seq_lens_q: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    limit: int,
    scheme: str,
    tracing: bool = False,
) -> Positions | None:
    """The document object of a forward pass of input `shape` (b, n) with (b, n) long `position_ids` (or None:
    0..m-1 in each document), or None for the fast path (no positions nor boundaries, or positions 0..n-1 in every
    row of a batch without padding). Everything the host needs (the positions' range, whether a row holds several
    documents, padding, each document's length) is read in one device -> host copy; nothing while `tracing`.
    Refused (ValueError): positions outside 0..limit-1 (the `scheme` model's), boundaries that do not describe
    the rows."""
    b, n = shape
    starts, cu_checks = document_starts(shape, device, position_ids, cu_seq_lens_q, seq_idx)
    if starts is None:
        return None
    documents = torch.cumsum(starts, dim=1) - 1  # (b, n): 0, 0, ..., 1, 1, ...
    column = torch.arange(n, device=device).expand(b, n)
    if position_ids is None:  # 0..m-1 in each document
        position_ids = column - torch.cummax(torch.where(starts, column, 0), dim=1).values
    real = None if attention_mask is None else attention_mask.to(device).bool()
    if tracing:  # one graph for every input: documents and padding always, nothing read on the host
        return Positions(position_ids, documents, real, starts=starts)
    probe = Positions(position_ids, documents, starts=starts)
    document, token = _global_documents(probe), torch.arange(b * n, device=device)
    ones = torch.ones_like(document)
    lengths = torch.zeros_like(document).scatter_add_(0, document, ones)  # (b * n,): the documents' first
    padded = torch.zeros_like(document)
    if real is not None:
        padded.scatter_add_(0, document, (~real).reshape(-1).long())
    first = torch.full_like(document, b * n).scatter_reduce(0, document, token, "amin")
    scalars = [
        position_ids.min(),
        position_ids.max(),
        starts[:, 1:].any(),
        torch.ones((), dtype=torch.bool, device=device) if real is None else real.all(),
        documents[:, -1].sum() + b,  # documents in all
        (position_ids.reshape(-1) == token - first[document]).all(),  # 0..m-1 in each document
        (position_ids == column).all(),
        *(torch.ones(2, dtype=torch.bool, device=device) if cu_checks is None else cu_checks),
    ]
    values = torch.cat(
        [torch.stack([x.long() for x in scalars]), lengths, padded]
    ).tolist()  # the one host read
    low, high, several, all_real, count, zero_based, plain, cu_bounds, cu_increasing = values[:9]
    if not cu_bounds:
        raise ValueError(_cu_refusal(cu_seq_lens_q.reshape(-1), b, n))
    if not cu_increasing:
        cu = cu_seq_lens_q.reshape(-1).tolist()
        raise ValueError(f"cu_seq_lens_q {cu} is not strictly increasing (an empty document?)")
    if low < 0 or high >= limit:
        raise ValueError(
            f"position_ids holds position {low if low < 0 else high}, outside the {scheme!r} model's positions "
            f"0..{limit - 1} (max_position_embeddings {limit}); split or truncate the document"
        )
    real = None if all_real else real
    if not several and real is None and plain:
        return None  # today's positions: the fast path
    return Positions(
        position_ids,
        documents if several else None,
        real,
        starts=starts,
        lengths=tuple(values[9 : 9 + count]),
        padded=tuple(values[9 + b * n : 9 + b * n + count]),
        zero_based=bool(zero_based),
    )


# A group of `DocumentRows` takes every document at least this fraction of its longest one's length: padding then
# costs at most 1 / GROUP_RATIO^2 (1.78x) of a group's attention work, and lengths 1..512 make at most 22 groups.
GROUP_RATIO = 0.75


class DocumentRows:
    """The documents of flattened rows laid out one per row, for attention only (`document_attention`): where
    every document's positions are 0..m-1 (what `DataCollatorWithFlattening` and `--packing documents` write), a
    document is attended exactly as if alone in its own row, so attention costs the sum of the documents' m^2
    instead of the rows' n^2, and the positional terms are those of positions 0..L-1, shared by every document
    (`PositionalContext.leading`), not one (n, n) term per row. The linear layers stay on the flattened tokens.

    Documents are sorted by length (longest first) and grouped (`GROUP_RATIO`); a group of g documents padded to
    the length L of its longest is one (g, h, L, d) batch of the kernel, the extra slots of its shorter documents
    masked as keys (they read the document's first token; their outputs are dropped). The layout's S slots are
    the groups' g * L, group after group, each document's L slots in a run.
    - reads (S,) long: the token (index into the b * n flattened tokens) each slot reads.
    - writes (b * n,) long: each token's slot.
    - groups ((g, L), ...) in layout order; paddings: per group, its (g, 1, 1, L) additive key mask (0 /
      dtype-min for extra slots and padded tokens), or None where it has neither.
    - length: the longest document (the positional terms are built for positions 0..length-1).
    """

    def __init__(
        self,
        reads: torch.Tensor,
        writes: torch.Tensor,
        groups: tuple[tuple[int, int], ...],
        paddings: tuple[torch.Tensor | None, ...],
    ):
        self.reads = reads
        self.writes = writes
        self.groups = groups
        self.paddings = paddings
        self.length = groups[0][1]

    @classmethod
    def of(cls, positions: Positions, dtype: torch.dtype) -> DocumentRows:
        """The layout of `positions`' documents (their positions 0..m-1, their lengths read on the host when the
        object was built: `Positions.rows` calls this); padded tokens stay in their document, as masked keys.
        Nothing is read on the host here: the groups, the order and the slots are computed from the host lengths
        and sent to the device."""
        b, n = positions.ids.shape
        device = positions.ids.device
        lengths, padded = positions.lengths, positions.padded
        document = _global_documents(positions)  # (b * n,) each token's document, numbered across rows
        token = torch.arange(b * n, device=device)
        # each document's first token
        first = torch.full((len(lengths),), b * n, device=device).scatter_reduce(0, document, token, "amin")
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # longest first, stable
        groups, begin = [], 0
        while begin < len(order):
            length, end = lengths[order[begin]], begin
            while end < len(order) and lengths[order[end]] >= GROUP_RATIO * length:
                end += 1
            groups.append((end - begin, length))
            begin = end
        widths = [length for count, length in groups for _ in range(count)]  # each document's slots, in order
        start, slot = [0] * len(lengths), 0
        for i, width in zip(order, widths):
            start[i], slot = slot, slot + width  # each document's first slot
        ids = positions.ids.reshape(-1)
        writes = torch.tensor(start, device=device)[document] + ids  # (b * n,) each token's slot
        order_t, widths_t = torch.tensor(order, device=device), torch.tensor(widths, device=device)
        reads = first[torch.repeat_interleave(order_t, widths_t, output_size=slot)].index_copy_(
            0, writes, token
        )
        real = torch.zeros(slot, dtype=torch.bool, device=device)
        real[writes] = True if positions.real is None else positions.real.reshape(-1)
        paddings, begin, k = [], 0, 0
        for count, length in groups:
            members = order[k : k + count]
            full = all(lengths[i] == length and padded[i] == 0 for i in members)  # no extra slot, no padding
            keep = real[begin : begin + count * length].view(count, 1, 1, length)
            padding = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(
                ~keep, torch.finfo(dtype).min
            )
            paddings.append(None if full else padding)
            begin, k = begin + count * length, k + count
        return cls(reads, writes, tuple(groups), tuple(paddings))


def _global_documents(positions: Positions) -> torch.Tensor:
    """(b * n,) long: each token's document, numbered across the rows (row 0's documents first)."""
    documents = positions.documents if positions.documents is not None else torch.zeros_like(positions.ids)
    counts = documents[:, -1] + 1  # (b,) documents per row (numbered 0.. in each row)
    return (documents + (torch.cumsum(counts, 0) - counts)[:, None]).reshape(-1)


def document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rows: DocumentRows,
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor | None], torch.Tensor],
) -> torch.Tensor:
    """Attention of (b, h, n, d) queries, keys and values inside each document, one group of `rows` at a time:
    `attend(q, k, v, L, padding)` runs a kernel on a group's (g, h, L, d) rows with its (g, 1, 1, L) key padding
    (or None) and returns (g, h, L, d). Returns (b, h, n, d), a transposed view of a contiguous (b, n, h, d)
    tensor, as the output projection reads it. One gather (`index_select`) per input and one for the output;
    the groups are split off the gathered slots, so their gradients join in one concatenation."""
    b, h, n, d = q.shape
    sizes = [count * length for count, length in rows.groups]
    # (b, h, n, d) -> (b * n, h, d) tokens (a view of the fused projection's output) -> (S, h, d) slots
    q, k, v = (
        x.transpose(1, 2).reshape(b * n, h, d).index_select(0, rows.reads).split(sizes) for x in (q, k, v)
    )
    outputs = [
        attend(*(x.view(count, length, h, d).transpose(1, 2) for x in group), length, padding)
        .transpose(1, 2)
        .reshape(count * length, h, d)
        for (count, length), padding, *group in zip(rows.groups, rows.paddings, q, k, v)
    ]
    return torch.cat(outputs).index_select(0, rows.writes).view(b, n, h, d).transpose(1, 2)
