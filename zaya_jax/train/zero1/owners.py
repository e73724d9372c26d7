"""ZeRO-1 owner layouts: which device keeps and updates which part of the optimizer state (arXiv 2511.17127 §2:
data parallelism with a distributed optimizer and a distributed Muon; docs/parallelism.md).

Every parameter is replicated over some mesh axes (all of them, or all but `expert` for routed experts under
expert parallelism). Those axes form the parameter's *group*; the group's n devices split its optimizer work:

* `SlotLayout` — Muon matrices, kept whole. The matrices of one layer are packed first-fit-decreasing into bins
  of S elements (S = the largest matrix of the group; small matrices share a bin), the same pattern for every
  layer. Bins are numbered layer-major (b = l·B + i); device d owns the s = ceil(L·B / n) consecutive bins
  [d·s, (d+1)·s) — its *slots* (the list is padded with empty bins). Both a layer's bins and a device's
  slots are contiguous rows of the [n·s, S] slot array: gradients are packed layer by layer, and the
  reduce-scatter / all-gather move each device's rows as one block.
  *Chunks* (`train.overlap_collectives`): the layers split into C chunks of k = L / C consecutive layers, each
  chunk's k·B bins numbered and spread over the n devices on their own (s_c = ceil(k·B / n) per device), so
  each chunk's reduce-scatter and all-gather is a collective of its own that can run inside the layer loop.
  The step's *packed* buffer holds the chunks one after the other ([C·n·s_c, S]: layer l's bins at
  `layer_row(l)`); a device's owned rows are its s_c rows of every chunk, chunk by chunk (s = C·s_c).
  `overlap_chunks` picks the most chunks whose padding stays within `OVERLAP_PADDING` of one chunk's.
  Without that option the layers still split into chunks where that pads nothing (`update_chunks`): the step
  then reduce-scatters, updates and all-gathers chunk by chunk, so chunk c's all-gather runs under the
  Newton–Schulz of the chunks after it (`zaya_jax.train.zero1.step`).
  The owner keeps a bin's momentum and fp32 master weights and runs Newton–Schulz on its matrices; nobody
  else touches them. Every device runs the same program: a slot's *type* (its pattern of matrix shapes)
  selects the branch.
* `FlatLayout` — elementwise (AdamW) leaves, flattened and concatenated (weight-decayed leaves first), padded to
  n·C elements; device d owns elements [d·C, (d+1)·C).

Everything here is static (plain Python/NumPy from shapes): it works for any device count, not only divisors
of the layer or expert count.
"""

from __future__ import annotations

import dataclasses

import numpy as np

EMPTY = -1  # slot type of a padding bin
OVERLAP_PADDING = 0.05  # chunked slot rows may exceed the unchunked ones by this fraction (`overlap_chunks`)
# the most layers in one chunk (`overlap_chunks`): the scattering pass unrolls a chunk's layers so that their
# GEMMs sit beside the pending reduce-scatter; longer chunks would make the step's program long for little
# (the one chunk that hides is 1/C of the rows)
OVERLAP_CHUNK_LAYERS = 4
# the most chunks of the pipelined update (`update_chunks`): chunk c's parameter all-gather hides under the
# Newton–Schulz of later chunks, so all but ~1/C of it can hide; beyond ~8 the last chunk's share is small
UPDATE_CHUNKS_MAX = 8
# the fewest slots a device owns per chunk of the pipelined update: a chunk's Newton–Schulz is what the other
# chunks' all-gathers hide under, and each extra chunk adds a reduce-scatter's and an all-gather's latency
# (ZAYA1-base on 1024 devices, 1 slot a chunk: 2 chunks hid 0.4 ms and cost 2.5 ms in the planner)
UPDATE_CHUNK_MIN_SLOTS = 4


@dataclasses.dataclass(frozen=True)
class Matrix:
    """One Muon matrix per layer: `leaf[l][index]` is [rows, cols] (split: column half `half` of the leaf)."""

    leaf: str  # parameter path name
    index: tuple[int, ...]  # index into the per-layer sub-array's leading dims
    rows: int
    cols: int
    half: int | None = None  # gate | up split of a fused [.., rows, 2·cols] kernel: 0 or 1

    @property
    def size(self) -> int:
        return self.rows * self.cols


@dataclasses.dataclass(frozen=True)
class Segment:
    matrix: Matrix
    offset: int  # first element inside the bin


def ns_flops(rows: int, cols: int, steps: int) -> float:
    """Newton–Schulz FLOPs of one [rows, cols] matrix: per iteration X·Xᵀ (2m²n), A·A (2m³), B·X (2m²n)."""
    m, n = min(rows, cols), max(rows, cols)
    return float(steps * (4 * m * m * n + 2 * m**3))


def _pack_bins(matrices: list[Matrix], capacity: int) -> list[tuple[Segment, ...]]:
    """First-fit decreasing of one layer's matrices into bins of `capacity` elements (stable for equal sizes)."""
    bins: list[list[Segment]] = []
    used: list[int] = []
    for mat in sorted(matrices, key=lambda m: -m.size):
        for i, u in enumerate(used):
            if u + mat.size <= capacity:
                bins[i].append(Segment(mat, u))
                used[i] += mat.size
                break
        else:
            bins.append([Segment(mat, 0)])
            used.append(mat.size)
    return [tuple(b) for b in bins]


def bin_type(segments: tuple[Segment, ...]) -> tuple:
    """What the update program of a bin depends on: its segments' (rows, cols, offset) — not which leaf or
    layer the matrices come from (gate, up and down of ZAYA1's experts share one type)."""
    return tuple((s.matrix.rows, s.matrix.cols, s.offset) for s in segments)


@dataclasses.dataclass(frozen=True)
class SlotLayout:
    """Muon matrices of one group (module docstring). `bins` is the per-layer pattern."""

    num_layers: int
    devices: int  # n: devices in the group
    bin_size: int  # S
    bins: tuple[tuple[Segment, ...], ...]  # B bins per layer
    types: tuple[tuple, ...]  # distinct bin types; `bin_types[i]` indexes into it
    chunks: int = 1  # C: chunks of consecutive layers with owners of their own (module docstring)

    @classmethod
    def build(cls, matrices: list[Matrix], num_layers: int, devices: int, chunks: int = 1) -> "SlotLayout":
        size = max((m.size for m in matrices), default=0)
        bins = tuple(_pack_bins(matrices, size)) if matrices else ()
        types = tuple(dict.fromkeys(bin_type(b) for b in bins))
        if num_layers % chunks:
            raise ValueError(f"{chunks} layer chunks do not divide {num_layers} layers")
        return cls(num_layers, devices, size, bins, types, chunks)

    @property
    def bins_per_layer(self) -> int:
        return len(self.bins)

    @property
    def num_bins(self) -> int:
        return self.num_layers * self.bins_per_layer

    @property
    def layers_per_chunk(self) -> int:
        return self.num_layers // self.chunks

    @property
    def chunk_slots(self) -> int:
        """s_c: bins per device of one chunk (0 when the group has no Muon matrix)."""
        return -(-self.layers_per_chunk * self.bins_per_layer // self.devices) if self.num_bins else 0

    @property
    def chunk_rows(self) -> int:
        """n·s_c: rows of one chunk in the packed buffer."""
        return self.devices * self.chunk_slots

    @property
    def slots(self) -> int:
        """s = C·s_c: bins per device (0 when the group has no Muon matrix)."""
        return self.chunks * self.chunk_slots

    @property
    def rows(self) -> int:
        """n·s: rows of the group's slot arrays [n·s, S] (≥ L·B; the rest are empty bins)."""
        return self.devices * self.slots

    def layer_row(self, layer):
        """First row of layer `layer`'s B bins in the packed buffer (an int, or a traced int)."""
        k = self.layers_per_chunk
        return (layer // k) * self.chunk_rows + (layer % k) * self.bins_per_layer

    @property
    def bin_types(self) -> tuple[int, ...]:
        return tuple(self.types.index(bin_type(b)) for b in self.bins)

    def _owned_bins(self) -> np.ndarray:
        """[n, s] index into the per-layer pattern of every owned slot (EMPTY for padding), chunk by chunk."""
        used = self.layers_per_chunk * self.bins_per_layer
        pos = np.arange(self.devices)[:, None] * self.chunk_slots + np.arange(self.chunk_slots)[None, :]
        index = np.where(pos < used, pos % max(self.bins_per_layer, 1), EMPTY)
        return np.tile(index, (1, self.chunks))

    def row_types(self) -> np.ndarray:
        """[n, s] int32 type of every slot (EMPTY for padding); device d's slots are row d."""
        index = self._owned_bins()
        per_layer = np.asarray(self.bin_types + (EMPTY,), np.int32)
        return per_layer[index].astype(np.int32)

    def ns_flops_per_device(self, steps: int) -> np.ndarray:
        """[n] Newton–Schulz FLOPs each device runs per optimizer step (its owned matrices)."""
        cost = [sum(ns_flops(s.matrix.rows, s.matrix.cols, steps) for s in b) for b in self.bins]
        return np.asarray(cost + [0.0])[self._owned_bins()].sum(axis=1)

    def padding_fraction(self) -> float:
        """Fraction of the slot arrays that hold no matrix (empty bins and unused bin tails)."""
        used = self.num_layers * sum(s.matrix.size for b in self.bins for s in b)
        return 1.0 - used / max(self.rows * self.bin_size, 1)


@dataclasses.dataclass(frozen=True)
class FlatLayout:
    """Elementwise leaves of one group (module docstring): `leaves` in storage order, decayed ones first."""

    devices: int
    leaves: tuple[tuple[str, int], ...]  # (path name, local element count)
    decayed: int  # elements [0, decayed) get weight decay

    @classmethod
    def build(cls, leaves: list[tuple[str, int, bool]], devices: int) -> "FlatLayout":
        order = [x for x in leaves if x[2]] + [x for x in leaves if not x[2]]
        return cls(devices, tuple((name, size) for name, size, _ in order), sum(x[1] for x in leaves if x[2]))

    @property
    def size(self) -> int:
        return sum(size for _, size in self.leaves)

    @property
    def chunk(self) -> int:
        """C: elements per device (0 when the group has no elementwise leaf)."""
        return -(-self.size // self.devices) if self.size else 0

    @property
    def padded(self) -> int:
        return self.devices * self.chunk


def describe(slots: SlotLayout, flat: FlatLayout, steps: int) -> dict:
    """Numbers for logs and the planner: slots per device, padding, NS balance (max / mean per device)."""
    load = slots.ns_flops_per_device(steps) if slots.num_bins else np.zeros(1)
    mean = float(load.mean()) if load.size else 0.0
    return {
        "devices": slots.devices,
        "bins_per_layer": slots.bins_per_layer,
        "slots_per_device": slots.slots,
        "layer_chunks": slots.chunks,
        "bin_types": len(slots.types),
        "slot_padding": slots.padding_fraction(),
        "ns_max_over_mean": float(load.max()) / mean if mean else 1.0,
        "flat_elements": flat.size,
        "flat_chunk": flat.chunk,
        "flat_padding": 1.0 - flat.size / max(flat.padded, 1),
    }


def overlap_chunks(bins_per_layer: tuple[int, ...], devices: tuple[int, ...], num_layers: int) -> int:
    """The most layer chunks C (C divides L, at most `OVERLAP_CHUNK_LAYERS` layers each) for which every group's
    chunked slot rows C·n·ceil(k·B / n) stay within `OVERLAP_PADDING` of its unchunked n·ceil(L·B / n); groups
    are given as (B, n) pairs. 1 when none."""

    def rows(b: int, n: int, chunks: int) -> int:
        return chunks * n * -(-(num_layers // chunks) * b // n)

    for chunks in sorted((c for c in range(1, num_layers + 1) if num_layers % c == 0), reverse=True):
        if num_layers // chunks > OVERLAP_CHUNK_LAYERS:
            break
        if all(rows(b, n, chunks) <= (1 + OVERLAP_PADDING) * rows(b, n, 1) for b, n in zip(bins_per_layer, devices)):
            return chunks
    return 1


def update_chunks(bins_per_layer: tuple[int, ...], devices: tuple[int, ...], num_layers: int) -> int:
    """Layer chunks C of the pipelined update (`train.pipeline_update`): among the C ≤ `UPDATE_CHUNKS_MAX`
    dividing L with at least `UPDATE_CHUNK_MIN_SLOTS` slots a device per chunk, summed over the groups (or
    C = 1), whose chunked slot rows C·n·ceil(k·B / n) are fewest (summed over groups, given as (B, n) pairs),
    the most. Never pads more than one chunk does: ZAYA1-base's 40 layers × 50 bins give C = 5 at n = 8 (2000
    rows, as unchunked, 50 slots a chunk), C = 4 at n = 128 (4 slots a chunk) and C = 1 at n = 96 and 1024.
    1 on one device (no all-gather to hide)."""
    if all(n == 1 for n in devices):
        return 1

    def slots(b: int, n: int, chunks: int) -> int:
        return -(-(num_layers // chunks) * b // n)

    def rows(chunks: int) -> int:
        return sum(chunks * n * slots(b, n, chunks) for b, n in zip(bins_per_layer, devices))

    options = [
        c
        for c in range(1, min(num_layers, UPDATE_CHUNKS_MAX) + 1)
        if num_layers % c == 0
        and (c == 1 or sum(slots(b, n, c) for b, n in zip(bins_per_layer, devices)) >= UPDATE_CHUNK_MIN_SLOTS)
    ]
    return min(options, key=lambda c: (rows(c), -c)) if options else 1
