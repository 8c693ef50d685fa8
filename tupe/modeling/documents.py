"""Positions and documents: what a forward pass given `position_ids` (or document boundaries) runs with.

`Positions` is what a scheme reads instead of `0..n-1` and what the kernels keep attention inside; `DocumentRows`
lays packed documents out one per row so that each is attended as if alone (`document_attention`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class Positions:
    """Positions given as data (`position_ids`), and the documents of each row: what a scheme reads instead of
    `0..n-1` when the model is given positions, and what the kernels keep attention inside.

    - ids (b, n) long: each token's position (`position_ids`); a document's first token has position 0.
    - documents (b, n) long or None: each token's document, numbered from 0 in each row (None: one document per
      row). A document is a run of tokens that starts where `position_ids` restart at 0 (or where explicit
      boundaries, `cu_seq_lens_q` / `seq_idx`, say); no token attends outside its own document.
    - real (b, n) bool or None: the tokens that are not padding (`attention_mask`); None: no padding.

    Integer data, no gradient.
    """

    def __init__(
        self, ids: torch.Tensor, documents: torch.Tensor | None = None, real: torch.Tensor | None = None
    ):
        self.ids = ids
        self.documents = documents
        self.real = real

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
    def of(cls, positions: Positions, dtype: torch.dtype) -> DocumentRows | None:
        """The layout of `positions`' documents, or None where a document's positions are not 0..m-1 (a
        document's later part; boundaries from `seq_idx`): such rows keep the (b, 1, n, n) block-diagonal mask.
        Padded tokens stay in their document, as masked keys. Decided on the host (from tensor values), so not
        while tracing."""
        b, n = positions.ids.shape
        device = positions.ids.device
        documents = (
            positions.documents if positions.documents is not None else torch.zeros_like(positions.ids)
        )
        counts = documents[:, -1] + 1  # (b,) documents per row (numbered 0.. in each row)
        document = (documents + (torch.cumsum(counts, 0) - counts)[:, None]).reshape(-1)  # (b * n,) global id
        token = torch.arange(b * n, device=device)
        first = torch.full((int(counts.sum()),), b * n, device=device).scatter_reduce(
            0, document, token, "amin"
        )  # (documents,) each document's first token
        ids = positions.ids.reshape(-1)
        if not torch.equal(ids, token - first[document]):
            return None
        lengths = torch.bincount(document)  # (documents,)
        order = torch.argsort(lengths, descending=True, stable=True)
        groups, begin, sorted_lengths = [], 0, lengths[order].tolist()
        while begin < len(sorted_lengths):
            length, end = sorted_lengths[begin], begin
            while end < len(sorted_lengths) and sorted_lengths[end] >= GROUP_RATIO * length:
                end += 1
            groups.append((end - begin, length))
            begin = end
        widths = torch.tensor([length for count, length in groups for _ in range(count)], device=device)
        start = torch.zeros_like(lengths)
        start[order] = torch.cumsum(widths, 0) - widths  # each document's first slot
        writes = start[document] + ids  # (b * n,) each token's slot: its position in its document's run
        reads = first[torch.repeat_interleave(order, widths)].index_copy_(0, writes, token)
        real = torch.zeros(reads.shape[0], dtype=torch.bool, device=device)
        real[writes] = True if positions.real is None else positions.real.reshape(-1)
        paddings, begin = [], 0
        for count, length in groups:
            keep = real[begin : begin + count * length].view(count, 1, 1, length)
            padding = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(
                ~keep, torch.finfo(dtype).min
            )
            paddings.append(None if bool(keep.all()) else padding)
            begin += count * length
        return cls(reads, writes, tuple(groups), tuple(paddings))


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
