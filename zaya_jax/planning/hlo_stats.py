"""Statistics from optimized HLO text (`compiled.as_text()`): dot FLOPs, collective bytes, loop trip counts.

Why parse text: XLA's `compiled.cost_analysis()` visits every while-loop body **once** (a `jax.lax.scan`
over 40 layers is counted as one layer), and it gives no per-collective breakdown. This module splits
the module into computations, builds the call graph (fusion `calls=`, `while` body × its
`known_trip_count`, `call`, `conditional` branches) and sums costs bottom-up. A `conditional` runs one
branch per execution, so it costs its most expensive branch (the max over branches of dot FLOPs, of HBM
bytes, and the collectives of the branch with the most wire bytes) — not the sum of its branches: e.g. a
`lax.switch` over slot types inside a `lax.scan` costs trip count × its largest branch. Everything is
**per device** (the SPMD-partitioned program one device runs).

* `dot_flops`: 2 · |result| · |contracted dims| for every `dot` and GPU GEMM library call (and a `convolution`
  estimate), weighted by the execution count. Elementwise work is not counted (it is < 1% for transformer-sized GEMMs).
* collectives: operand bytes of every all-reduce / all-gather / reduce-scatter / all-to-all /
  collective-permute (async `-start` forms included; a bf16 collective that XLA:CPU widened to f32 with
  converts around it counts in bf16, as an accelerator sends it), weighted by the execution count, with the device
  groups parsed from `replica_groups` (`zaya_jax.planning.hlo_collectives`) for bus-bandwidth factors; every
  collective instruction with its executions per run is in `collective_ops` (for `zaya_jax.planning.cluster`).
* `hbm_bytes`: operand + result bytes of every top-level instruction (fusion bodies excluded), slicing-aware
  like XLA's cost analysis (a sliced fusion parameter counts its slice, an in-place dynamic-update-slice its
  update); `hbm_bytes_once` reproduces `cost_analysis()["bytes accessed"]` to a few percent.
* `dot_flops_by_tag`: dot FLOPs split by the op_name metadata JAX attaches (default: forward/backward ops
  emitted under `jvp` vs everything else, i.e. the optimizer update).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict
from typing import Callable

from zaya_jax.planning.hlo_collectives import (
    COLLECTIVES,
    WIRE_FACTOR,
    CollectiveOp,
    CollectiveStats,
    parse_groups,
    payload_bytes,
)
from zaya_jax.planning.hlo_text import (
    CALLS,
    DTYPE_BYTES,
    NAME,
    Instr,
    gemm_call,
    op_name,
    parse_computations,
    shape_bytes,
    shape_dims,
)

__all__ = [
    "COLLECTIVES",
    "DTYPE_BYTES",
    "WIRE_FACTOR",
    "CollectiveOp",
    "CollectiveStats",
    "HloStats",
    "Instr",
    "analyze",
    "parse_computations",
    "shape_bytes",
    "shape_dims",
]


@dataclasses.dataclass
class HloStats:
    """Per-device statistics of one SPMD program run."""

    dot_flops: float
    dot_flops_once: float  # the same with every loop body counted once (what cost_analysis does)
    dot_flops_by_tag: dict[str, float]  # dot_flops split by `classify(op_name metadata)`
    hbm_bytes: float  # memory-traffic estimate: operands + results of every top-level op (slicing-aware)
    hbm_bytes_once: float  # the same with every loop body counted once
    collectives: dict[str, CollectiveStats]
    trip_counts: dict[str, int]  # while body computation → trip count
    unknown_trip_counts: int
    num_instructions: int
    collective_ops: list[tuple[CollectiveOp, float]] = dataclasses.field(default_factory=list)  # (op, executions)
    # dot FLOPs of one run of each computation that issues a collective, its own: nested `while` loops excluded
    # (what a collective there can overlap with, `zaya_jax.planning.overlap`)
    flops_per_run: dict[str, float] = dataclasses.field(default_factory=dict)
    # the step's top level (`top_level_cover`): per collective instruction there, the compute instructions
    # (dots, fusions or loops with dot FLOPs) it neither feeds nor waits for; and their dot FLOPs per step
    top_cover: dict[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    top_waits: dict[str, bool] = dataclasses.field(default_factory=dict)  # it waits for one of any cover
    top_flops: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def collective_bytes(self) -> float:
        return sum(c.operand_bytes for c in self.collectives.values())

    @property
    def wire_bytes(self) -> float:
        return sum(c.wire_bytes for c in self.collectives.values())


def _trip_count(instr: Instr, comps: dict[str, list[Instr]]) -> int | None:
    m = re.search(r'known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"', instr.attrs)
    if m:
        return int(m.group(1))
    cond = re.search(r"condition=%?([\w.\-]+)", instr.attrs)  # fallback: the loop bound in the condition
    consts = [
        int(i.args)
        for i in comps.get(cond.group(1) if cond else "", [])
        if i.opcode == "constant" and i.args.isdigit() and i.shape.startswith(("s32[]", "s64[]"))
    ]
    return max(consts) if consts else None


def _branches(instr: Instr) -> list[str]:
    m = re.search(r"branch_computations=\{([^}]*)\}", instr.attrs)
    names = NAME.findall(m.group(1)) if m else []
    return names + re.findall(r"(?:true|false)_computation=%?([\w.\-]+)", instr.attrs)


def callees(instr: Instr, comps: dict[str, list[Instr]]) -> list[tuple[str, int | None]]:
    """(callee, multiplier) for computations this instruction runs; None multiplier = unknown trip count."""
    a = instr.attrs
    if instr.opcode == "while":
        body = re.search(r"body=%?([\w.\-]+)", a)
        return [(body.group(1), _trip_count(instr, comps))] if body else []
    out = [(c, 1) for c in CALLS.findall(a)]
    if instr.opcode == "call":
        out += [(c, 1) for c in re.findall(r"to_apply=%?([\w.\-]+)", a)]
    return out + [(c, 1) for c in _branches(instr)]


def is_gemm_call(instr: Instr) -> bool:
    """A dense GPU GEMM library call (`hlo_text.gemm_call`); a grouped one's FLOPs depend on the routing, known at
    run time, so they are not counted from its shapes."""
    return gemm_call(instr) == "dense"


def _dot_flops(instr: Instr, shapes: dict[str, str]) -> float:
    out = math.prod(shape_dims(instr.shape))
    if instr.opcode in ("dot", "custom-call"):
        lhs = shape_dims(shapes.get(instr.operands[0], "")) if instr.operands else []
        m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", instr.attrs)
        m = m or re.search(r'"lhs_contracting_dimensions":\[([0-9",]*)\]', instr.attrs)
        dims = [int(d) for d in m.group(1).replace('"', "").split(",") if d] if m else []
        return 2.0 * out * math.prod(lhs[d] for d in dims if d < len(lhs))
    # convolution: 2 · |out| · |kernel| / out_features
    kernel = shape_dims(shapes.get(instr.operands[1], "")) if len(instr.operands) > 1 else []
    labels = re.search(r"dim_labels=\w+_(\w+)->", instr.attrs)
    o_dim = labels.group(1).find("o") if labels else -1
    if not kernel or o_dim < 0:
        return 0.0
    return 2.0 * out * math.prod(kernel) / kernel[o_dim]


_NO_TRAFFIC = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "partition-id",
        "replica-id",
        "while",
        "call",
        "conditional",
    }
)
_SLICES = ("dynamic-slice", "slice", "gather")


_VIEWS = ("convert", "bitcast", "reshape", "copy")  # looked through when matching slice / in-place patterns


def _fusion_traffic(instr: Instr, shapes: dict[str, str], callee: list[Instr]) -> float:
    """Bytes a fusion reads and writes: a parameter only sliced inside counts its slices, a buffer updated
    in place (dynamic-update-slice, possibly wrapped in converts by XLA:CPU) counts only the update — as
    XLA's cost analysis treats them (and as an accelerator executes them)."""
    by_name = {i.name: i for i in callee}
    params = {int(i.args): i.name for i in callee if i.opcode == "parameter" and i.args.isdigit()}

    def users(name: str) -> list[tuple[Instr, str]]:
        out = []
        for u in callee:
            if name in u.operands:
                out += users(u.name) if u.opcode in _VIEWS else [(u, name)]
        return out

    total = 0.0
    for idx, operand in enumerate(instr.operands):
        uses = users(params[idx]) if idx in params else []
        if uses and all(u.opcode in _SLICES and u.operands[0] == via for u, via in uses):
            total += sum(shape_bytes(u.shape) for u, _ in uses)
        elif not any(u.opcode == "dynamic-update-slice" and u.operands[0] == via for u, via in uses):
            total += shape_bytes(shapes.get(operand, ""))
    root = next((i for i in callee if i.root), None)
    while root is not None and root.opcode in _VIEWS and root.operands:
        root = by_name.get(root.operands[0])
    if root is not None and root.opcode == "dynamic-update-slice" and len(root.operands) > 1:
        return total + shape_bytes(by_name[root.operands[1]].shape if root.operands[1] in by_name else "")
    return total + shape_bytes(instr.shape)


def _traffic(instr: Instr, shapes: dict[str, str], comps: dict[str, list[Instr]]) -> float:
    op = instr.opcode
    if op in _NO_TRAFFIC or op.endswith("-done"):
        return 0.0
    if op in _SLICES:
        return 2 * shape_bytes(instr.shape)
    if op == "dynamic-update-slice" and len(instr.operands) > 1:
        return 2 * shape_bytes(shapes.get(instr.operands[1], ""))
    callee = CALLS.search(instr.attrs)
    if op == "fusion" and callee and callee.group(1) in comps:
        return _fusion_traffic(instr, shapes, comps[callee.group(1)])
    if is_gemm_call(instr):  # the product, not the library's scratch workspace
        return shape_bytes(_first_array(instr.shape)) + sum(shape_bytes(shapes.get(o, "")) for o in instr.operands)
    return shape_bytes(instr.shape) + sum(shape_bytes(shapes.get(o, "")) for o in instr.operands)


def _first_array(shape: str) -> str:
    m = re.search(r"[a-z]+[0-9]*\[[0-9,]*\]", shape)
    return m.group(0) if m else ""


def autodiff_tag(op_name: str) -> str:
    """Default `classify`: "autodiff" for ops JAX emitted under `jvp`/`transpose` (a train step's forward and
    backward pass), "other" for the rest (e.g. the optimizer update)."""
    return "autodiff" if "jvp(" in op_name else "other"


def _caller_op_names(comps: dict[str, list[Instr]]) -> dict[str, str]:
    """For every called computation, an op_name describing its call site: the calling instruction's own, else
    that of an instruction producing one of its operands, else the enclosing computation's call site."""
    direct, parent = {}, {}
    for comp, instrs in comps.items():
        by_name = {i.name: i for i in instrs}
        for instr in instrs:
            for callee, _ in callees(instr, comps):
                names = [op_name(instr)] + [op_name(by_name[o]) for o in instr.operands if o in by_name]
                direct.setdefault(callee, next((n for n in names if n), ""))
                parent.setdefault(callee, comp)

    def resolve(comp: str, depth: int = 0) -> str:
        if direct.get(comp) or comp not in parent or depth > 50:
            return direct.get(comp, "")
        return resolve(parent[comp], depth + 1)

    return {comp: resolve(comp) for comp in direct}


@dataclasses.dataclass
class _Cost:
    """Cost of one run of a computation, callees included (`*_once`: every loop body counted once)."""

    flops: float = 0.0
    flops_once: float = 0.0
    flops_own: float = 0.0  # this computation's dot FLOPs outside nested `while` loops (fusions, calls, branches in)
    traffic: float = 0.0
    traffic_once: float = 0.0
    by_tag: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    ops: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))  # collective → runs

    def add(self, other: "_Cost", times: float, times_once: float, loop: bool = False) -> None:
        """Add `times` runs of callee `other` (`loop`: a `while` body, whose FLOPs are not this one's own)."""
        self.flops += times * other.flops
        if not loop:
            self.flops_own += times * other.flops_own
        self.flops_once += times_once * other.flops_once
        self.traffic += times * other.traffic
        self.traffic_once += times_once * other.traffic_once
        for tag, f in other.by_tag.items():
            self.by_tag[tag] += times * f
        for key, runs in other.ops.items():
            self.ops[key] += times * runs


def _most_expensive(branches: list[_Cost], wire: Callable[[_Cost], float]) -> _Cost:
    """One execution of a conditional: per metric the most expensive branch (`wire` ranks collectives)."""
    if not branches:
        return _Cost()
    top = max(branches, key=lambda b: b.flops)
    comm = max(branches, key=lambda b: (wire(b), b.flops))
    return _Cost(
        top.flops,
        max(b.flops_once for b in branches),
        top.flops_own,
        max(b.traffic for b in branches),
        max(b.traffic_once for b in branches),
        defaultdict(float, top.by_tag),
        defaultdict(float, comm.ops),
    )


def analyze(text: str, num_devices: int, classify: Callable[[str], str] = autodiff_tag) -> HloStats:
    """Parse `compiled.as_text()` of one SPMD program; see the module docstring. `classify(op_name) -> tag`
    splits the dot FLOPs (an instruction without metadata inherits its calling fusion's op_name)."""
    comps, entry = parse_computations(text)
    caller_op = _caller_op_names(comps)
    fused = {
        c
        for instrs in comps.values()
        for i in instrs
        for c, _ in callees(i, comps)
        if i.opcode not in ("while", "call", "conditional")
    }
    ops: dict[str, CollectiveOp] = {}
    trips: dict[str, int] = {}
    unknown: set[str] = set()
    memo: dict[str, _Cost] = {}

    def wire(cost: _Cost) -> float:
        return sum(runs * ops[key].wire_bytes for key, runs in cost.ops.items())

    def total(name: str, stack: tuple = ()) -> _Cost:
        if name in memo:
            return memo[name]
        cost = _Cost()
        if name not in comps or name in stack:
            return cost
        shapes = {i.name: i.shape for i in comps[name]}
        by_name = {i.name: i for i in comps[name]}
        for instr in comps[name]:
            if instr.opcode in ("dot", "convolution") or is_gemm_call(instr):
                f = _dot_flops(instr, shapes)
                cost.flops, cost.flops_once, cost.flops_own = cost.flops + f, cost.flops_once + f, cost.flops_own + f
                cost.by_tag[classify(op_name(instr) or caller_op.get(name, ""))] += f
            kind = instr.opcode[:-6] if instr.opcode.endswith("-start") else instr.opcode
            if kind in COLLECTIVES:
                key = f"{name}/{instr.name}"
                payload = sum(payload_bytes(instr, o, by_name, comps, comps[name]) for o in instr.operands)
                groups = parse_groups(kind, instr.attrs, num_devices)
                ops[key] = CollectiveOp(kind, instr.name, payload, groups, name)
                cost.ops[key] += 1
            if name not in fused:
                t = _traffic(instr, shapes, comps)
                cost.traffic, cost.traffic_once = cost.traffic + t, cost.traffic_once + t
            if instr.opcode == "conditional":
                cost.add(_most_expensive([total(b, stack + (name,)) for b in _branches(instr)], wire), 1, 1)
                continue
            for callee, k in callees(instr, comps):
                if instr.opcode == "while":
                    if k is None:
                        unknown.add(f"{name}/{instr.name}")
                    else:
                        trips[callee] = k
                cost.add(total(callee, stack + (name,)), 1 if k is None else k, 1, loop=instr.opcode == "while")
        memo[name] = cost
        return cost

    run = total(entry)
    top_flops = {}
    shapes = {i.name: i.shape for i in comps.get(entry, [])}
    for instr in comps.get(entry, []):
        f = _dot_flops(instr, shapes) if instr.opcode in ("dot", "convolution") or is_gemm_call(instr) else 0.0
        if instr.opcode == "conditional":
            f += max((memo[b].flops for b in _branches(instr) if b in memo), default=0.0)
        else:
            f += sum(memo[c].flops * (k or 1) for c, k in callees(instr, comps) if c in memo)
        if f > 0:
            top_flops[instr.name] = f
    cover, waits = top_level_cover(comps.get(entry, []), top_flops)
    coll: dict[str, CollectiveStats] = {}
    for key, runs in run.ops.items():
        op = ops[key]
        stats = coll.setdefault(op.kind, CollectiveStats())
        stats.count += int(round(runs))
        stats.operand_bytes += runs * op.operand_bytes
        stats.wire_bytes += runs * op.wire_bytes
    return HloStats(
        run.flops,
        run.flops_once,
        dict(run.by_tag),
        run.traffic,
        run.traffic_once,
        coll,
        trips,
        len(unknown),
        sum(len(v) for v in comps.values()),
        [(ops[key], runs) for key, runs in run.ops.items()],
        {op.computation: memo[op.computation].flops_own for op in ops.values() if op.computation in memo},
        cover,
        waits,
        {n: top_flops[n] for names in cover.values() for n in names},
    )


def top_level_cover(instrs: list[Instr], compute: dict[str, float]) -> tuple[dict, dict]:
    """For each collective among `instrs` (one computation, the step's top level): the `compute` instructions it
    neither depends on nor feeds — what an accelerator can run while it is in flight (e.g. chunk c's parameter
    all-gather beside the Newton–Schulz of the other chunks) — and whether it waits for any instruction that
    covers some collective (then it cannot hide under all of them: one such stays exposed)."""
    edges: dict[str, dict[str, list[str]]] = {"up": {}, "down": {}}
    for i in instrs:
        edges["up"][i.name] = list(i.operands)
        for o in i.operands:
            edges["down"].setdefault(o, []).append(i.name)

    def reach(name: str, way: str) -> set[str]:
        seen, todo = set(), [name]
        while todo:
            for o in edges[way].get(todo.pop(), ()):
                if o not in seen:
                    seen.add(o)
                    todo.append(o)
        return seen

    collectives = [i.name for i in instrs if i.opcode.removesuffix("-start") in COLLECTIVES]
    ancestors = {c: reach(c, "up") for c in collectives}
    cover = {c: frozenset(y for y in compute if y not in ancestors[c]) - reach(c, "down") for c in collectives}
    union = frozenset().union(*cover.values()) if cover else frozenset()
    return cover, {c: bool(ancestors[c] & union) for c in collectives}
