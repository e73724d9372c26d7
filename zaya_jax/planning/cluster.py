"""A model of the paper's cluster for pricing collectives and memory-bound passes (arXiv 2511.17127 §2–3:
128 nodes × 8 MI300X, rails-only Pollara 400 fabric).

Topology: nodes of `gpus_per_node` GPUs, fully connected inside a node by xGMI (`xgmi_links` links per GPU,
one to each peer); one NIC per GPU; two-level **rails-only**: NIC k of every node hangs off rail switch k,
so GPU k of node A reaches GPU k of node B over one rail, and traffic to another local rank first crosses
xGMI. Device i of a program (its position in the flattened mesh; the innermost mesh axis varies fastest)
lives on node i // gpus_per_node, local rank i % gpus_per_node.

Every stage costs α + bytes / β (Hockney):

* intra-node stage over g GPUs of one node (direct algorithm over the full mesh: every GPU sends to its
  g − 1 peers at once, one link each): `α_xgmi + bytes_per_peer / β_link`;
* inter-node stage over m nodes (ring per rail, g rails in parallel): `(m − 1)·α_nic + (m − 1)/m · S_rail /
  β_nic`, where S_rail is the data one GPU's rail carries; a group with one GPU per node on different
  local ranks (cross-rail) adds one xGMI forwarding hop.

Collectives over a group of n = g·m devices (S = the per-device buffer: all-reduce buffer, reduce-scatter
input, all-gather output, all-to-all send buffer):

* reduce-scatter = intra-node RS (S over g) → inter-node RS per rail on S/g (over m);
* all-gather mirrors it: inter-node AG per rail (S/g) → intra-node AG (S);
* all-reduce = RS → AG (intra RS → inter RS → inter AG → intra AG);
* all-to-all: S/n to every peer; the share for other nodes leaves over this GPU's NIC after an xGMI hop to
  the GPU on the right rail (rails-only): `α_xgmi + (S/n + (n−g)/n · S/g)/β_link + (m−1)·α_nic +
  (n−g)/n · S/β_nic`;
* collective-permute (each device sends S to one peer): `α_xgmi + S/β_link` inside a node,
  `α_nic + S/β_nic` (+ one xGMI hop when it changes rail) across nodes.

Stages run one after another (no overlap, no compute overlap). Every number is a named field of
`Cluster`; `describe()` lists them so a plan states its assumptions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from zaya_jax.planning.hlo_collectives import CollectiveOp

# [Z] 128 nodes × 8 MI300X, 8 Pollara 400 NICs per node (one per GPU), rails-only (arXiv 2511.17127 §2)
GPUS_PER_NODE = 8
# [B] 7 xGMI (Infinity Fabric) links per MI300X, 64 GB/s per direction peak, ≈ 48 GB/s achieved (ROCm blog)
XGMI_LINKS = 7
XGMI_LINK_BANDWIDTH = 48e9
# [B] Pollara 400: 400 Gb/s = 50 GB/s per NIC, per direction
NIC_BANDWIDTH = 50e9
# [I] achieved fraction of NIC line rate for large RCCL transfers (typical of RoCE at 400G); xGMI's 48 GB/s
# above is already an achieved figure, so its efficiency is 1
NIC_EFFICIENCY = 0.9
XGMI_EFFICIENCY = 1.0
# [I] latency per communication step: ≈ 5 µs inside a node, ≈ 10 µs per step over the network
ALPHA_XGMI = 5e-6
ALPHA_NIC = 10e-6
# [B] achieved fraction of peak HBM bandwidth for streaming elementwise kernels (MI300X copy/triad benchmarks
# reach ≈ 4–4.3 of 5.3 TB/s)
HBM_EFFICIENCY = 0.8


@dataclasses.dataclass(frozen=True)
class Stage:
    """Seconds of one priced collective, split by what they are spent on."""

    latency: float = 0.0  # α terms
    xgmi: float = 0.0  # bytes over xGMI links
    nic: float = 0.0  # bytes over the NIC / rail

    @property
    def seconds(self) -> float:
        return self.latency + self.xgmi + self.nic

    def __add__(self, other: "Stage") -> "Stage":
        return Stage(self.latency + other.latency, self.xgmi + other.xgmi, self.nic + other.nic)

    def scale(self, k: float) -> "Stage":
        return Stage(k * self.latency, k * self.xgmi, k * self.nic)


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Nodes of `gpus_per_node` GPUs on xGMI, one NIC per GPU, rails-only (see the module docstring)."""

    gpus_per_node: int = GPUS_PER_NODE
    xgmi_links: int = XGMI_LINKS
    xgmi_link_bandwidth: float = XGMI_LINK_BANDWIDTH
    xgmi_efficiency: float = XGMI_EFFICIENCY
    nic_bandwidth: float = NIC_BANDWIDTH
    nic_efficiency: float = NIC_EFFICIENCY
    alpha_xgmi: float = ALPHA_XGMI
    alpha_nic: float = ALPHA_NIC
    hbm_efficiency: float = HBM_EFFICIENCY

    def __post_init__(self):
        if self.gpus_per_node < 1 or self.xgmi_links < self.gpus_per_node - 1:
            raise ValueError(
                f"cluster: {self.gpus_per_node} GPUs per node need >= {self.gpus_per_node - 1} "
                f"xGMI links per GPU for a fully connected node, got {self.xgmi_links}"
            )

    @property
    def link(self) -> float:
        """Achieved bytes/s of one xGMI link."""
        return self.xgmi_link_bandwidth * self.xgmi_efficiency

    @property
    def nic(self) -> float:
        """Achieved bytes/s of one NIC."""
        return self.nic_bandwidth * self.nic_efficiency

    def describe(self) -> list[str]:
        """The assumptions, one line each (printed with every plan)."""
        return [
            f"GPUs per node {self.gpus_per_node}, fully connected by xGMI: {self.xgmi_links} links x "
            f"{self.xgmi_link_bandwidth / 1e9:.0f} GB/s x efficiency {self.xgmi_efficiency:g} per GPU",
            f"one NIC per GPU: {self.nic_bandwidth / 1e9:.0f} GB/s x efficiency {self.nic_efficiency:g}, "
            "two-level rails-only (GPU k of every node on rail switch k)",
            f"latency per step: alpha xGMI {self.alpha_xgmi * 1e6:g} us, alpha network {self.alpha_nic * 1e6:g} us",
            "device i sits on node i // gpus_per_node (flattened mesh order, innermost axis in a node)",
            "hierarchical collectives: RS = intra-node RS -> inter-node RS per rail on 1/g of the data; AG mirrored;"
            " AR = RS + AG; stages and collectives not overlapped",
            f"HBM: achieved {self.hbm_efficiency:g} x peak bandwidth for the memory-bound passes",
        ]

    # ------------------------------------------------------------------ stages

    def intra(self, size: float, g: int) -> Stage:
        """Reduce-scatter or all-gather of a per-GPU buffer of `size` bytes over g GPUs of one node."""
        if g <= 1:
            return Stage()
        return Stage(self.alpha_xgmi, size / g / self.link)

    def inter(self, size: float, m: int) -> Stage:
        """Ring reduce-scatter or all-gather over m nodes of `size` bytes per rail."""
        if m <= 1:
            return Stage()
        return Stage((m - 1) * self.alpha_nic, 0.0, (m - 1) / m * size / self.nic)

    def layout(self, group: Sequence[int]) -> tuple[int, int, bool]:
        """(GPUs per node g, nodes m, cross_rail) of a device group."""
        nodes: dict[int, int] = {}
        for d in group:
            nodes[d // self.gpus_per_node] = nodes.get(d // self.gpus_per_node, 0) + 1
        ranks = {d % self.gpus_per_node for d in group}
        g = min(nodes.values()) if nodes else 1
        return g, len(nodes), g == 1 and len(nodes) > 1 and len(ranks) > 1

    def _rail_hop(self, size: float, cross_rail: bool) -> Stage:
        return Stage(self.alpha_xgmi, size / self.link) if cross_rail else Stage()

    # ------------------------------------------------------------------ collectives

    def reduce_scatter(self, size: float, group: Sequence[int]) -> Stage:
        """`size` = per-device input bytes (n × the output shard)."""
        g, m, cross = self.layout(group)
        return self.intra(size, g) + self.inter(size / g, m) + self._rail_hop(size / g, cross)

    def all_gather(self, size: float, group: Sequence[int]) -> Stage:
        """`size` = per-device output bytes (n × the input shard)."""
        return self.reduce_scatter(size, group)

    def all_reduce(self, size: float, group: Sequence[int]) -> Stage:
        return self.reduce_scatter(size, group).scale(2.0)

    def all_to_all(self, size: float, group: Sequence[int]) -> Stage:
        """`size` = per-device send buffer (size / n to every member)."""
        g, m, cross = self.layout(group)
        n = g * m
        if n <= 1:
            return Stage()
        remote = (n - g) / n * size
        out = Stage(self.alpha_xgmi, (size / n + remote / g) / self.link) if g > 1 else Stage()
        if m > 1:
            out = out + Stage((m - 1) * self.alpha_nic, 0.0, remote / self.nic)
            out = out + self._rail_hop(remote, cross)
        return out

    def permute(self, size: float, pairs: Sequence[Sequence[int]]) -> Stage:
        """Every source sends `size` bytes to its target; priced by the slowest pair."""
        gpn = self.gpus_per_node
        moving = [(s, t) for s, t in pairs if s != t]  # a device sending to itself moves nothing
        remote = [(s, t) for s, t in moving if s // gpn != t // gpn]
        if not remote:
            return Stage(self.alpha_xgmi, size / self.link) if moving else Stage()
        cross = any(s % gpn != t % gpn for s, t in remote)
        return Stage(self.alpha_nic, 0.0, size / self.nic) + self._rail_hop(size, cross)

    def collective(self, op: CollectiveOp) -> Stage:
        """One execution of an HLO collective (per-device operand bytes, device groups from `replica_groups`)."""
        if op.kind == "collective-permute":
            return self.permute(op.operand_bytes, op.groups)
        group = max(op.groups, key=len, default=())
        if len(group) <= 1:
            return Stage()
        if op.kind == "all-gather":
            return self.all_gather(op.operand_bytes * len(group), group)
        if op.kind == "reduce-scatter":
            return self.reduce_scatter(op.operand_bytes, group)
        if op.kind == "all-reduce":
            return self.all_reduce(op.operand_bytes, group)
        if op.kind in ("all-to-all", "ragged-all-to-all"):
            return self.all_to_all(op.operand_bytes, group)
        return self.all_gather(op.operand_bytes, group)  # collective-broadcast: one buffer down a tree/ring


def price(cluster: Cluster, ops: Sequence[tuple[CollectiveOp, float]]) -> dict[str, Stage]:
    """Seconds per collective kind for `hlo_stats.HloStats.collective_ops` ((op, executions) pairs)."""
    out: dict[str, Stage] = {}
    for op, runs in ops:
        out[op.kind] = out.get(op.kind, Stage()) + cluster.collective(op).scale(runs)
    return out
