"""Collective instructions of optimized HLO text: kinds, bus-bandwidth factors and device groups.

`zaya_jax.planning.hlo_stats` finds the collectives of a program; this module describes one of them
(`CollectiveOp`: kind, per-device operand bytes, the device groups it runs over) so that a network model
(`zaya_jax.planning.cluster`) can price it. Device ids in the groups are positions in the program's device
assignment, i.e. the flattened order of the mesh's devices (XLA's global device ids with
`use_global_device_ids=true`).

Group notations XLA prints (all handled by `parse_groups`):

* explicit lists `replica_groups={{0,1},{2,3}}`; `{}` = one group of every device;
* iota lists `replica_groups=[G,S]<=[d0,d1,...]T(p0,p1,...)`: `arange(∏d).reshape(d).transpose(p).reshape(G,S)`;
* mesh form `replica_groups=mesh['axis_0'=a,'axis_1'=b], device_ids=([d...]T(p...)) {'axis_1'}`: the
  devices (optionally permuted by the iota `device_ids`) laid out on the named axes; a group = the devices
  that differ only along the braced axes;
* collective-permute `source_target_pairs={{0,1},{1,2}}` (kept as 2-tuples).

Operand bytes (`payload_bytes`) are counted in the dtype the values really have: XLA:CPU widens bf16
collectives to f32 (convert → collective → convert back), an accelerator sends bf16.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from zaya_jax.planning.hlo_text import ARRAY, CALLS, DTYPE_BYTES, Instr, shape_bytes

COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "ragged-all-to-all",
    "collective-broadcast",
)
# bytes a device puts on its links per byte of the collective's per-device operand S (busbw convention of
# arXiv 2511.17127 §5 style collective benchmarks): ring all-reduce 2(n-1)/n·S; all-gather (n-1)·S_in (=
# (n-1)/n of the gathered output); reduce-scatter / all-to-all (n-1)/n·S; point-to-point S
WIRE_FACTOR = {
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "all-gather": lambda n: n - 1,
    "reduce-scatter": lambda n: (n - 1) / n,
    "all-to-all": lambda n: (n - 1) / n,
    "ragged-all-to-all": lambda n: (n - 1) / n,
    "collective-permute": lambda n: 1.0,
    "collective-broadcast": lambda n: 1.0,
}

_IOTA = re.compile(r"\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?")
_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(([^)]*\)?)\))?\s*\{([^}]*)\}")
_EXPLICIT = re.compile(r"replica_groups=\{((?:\{[0-9,\s]*\},?\s*)*)\}")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{[0-9,\s]*\},?\s*)*)\}")


@dataclasses.dataclass
class CollectiveStats:
    count: int = 0  # executions per step (static ops × loop trip counts)
    operand_bytes: float = 0.0  # Σ per-device operand bytes over executions
    wire_bytes: float = 0.0  # Σ bytes sent per device (busbw factors applied)


@dataclasses.dataclass(frozen=True)
class CollectiveOp:
    """One collective instruction. `groups`: device groups (collective-permute: its (source, target) pairs)."""

    kind: str
    name: str
    operand_bytes: float  # per device, per execution
    groups: tuple[tuple[int, ...], ...]
    computation: str = ""  # the HLO computation it is issued in (a while body: a loop of the step)

    @property
    def group_size(self) -> int:
        if self.kind == "collective-permute":
            return 2
        return max((len(g) for g in self.groups), default=1)

    @property
    def wire_bytes(self) -> float:
        """Bytes one device sends per execution (busbw factor × operand bytes); a permute whose pairs all
        send to themselves moves nothing."""
        if self.kind == "collective-permute" and self.groups and all(s == t for s, t in self.groups):
            return 0.0
        return self.operand_bytes * WIRE_FACTOR[self.kind](max(self.group_size, 1))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _iota(dims: list[int], perm: list[int] | None) -> np.ndarray:
    ids = np.arange(math.prod(dims)).reshape(dims)
    return ids.transpose(perm) if perm else ids


def _nested(text: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(_ints(g)) for g in re.findall(r"\{([0-9,\s]*)\}", text))


def parse_groups(kind: str, attrs: str, num_devices: int) -> tuple[tuple[int, ...], ...]:
    """Device groups of a collective from its attribute text (see the module docstring)."""
    if kind == "collective-permute":
        m = _PAIRS.search(attrs)
        return _nested(m.group(1)) if m else ()
    m = _MESH.search(attrs)
    if m:
        axes = re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group(1))
        sizes = [int(s) for _, s in axes]
        ids = np.arange(math.prod(sizes))
        if m.group(2):
            iota = re.match(r"\[([0-9,]+)\](?:T\(([0-9,]+)\))?", m.group(2))
            if iota:
                ids = _iota(_ints(iota.group(1)), _ints(iota.group(2)) if iota.group(2) else None).reshape(-1)
        grid = ids.reshape(sizes)
        names = [a for a, _ in axes]
        grouped = [names.index(a) for a in re.findall(r"'([^']+)'", m.group(3)) if a in names]
        rest = [i for i in range(len(names)) if i not in grouped]
        size = math.prod(sizes[i] for i in grouped)
        return tuple(map(tuple, grid.transpose(rest + grouped).reshape(-1, size).tolist()))
    m = re.search(r"replica_groups=" + _IOTA.pattern, attrs)
    if m:
        shape = _ints(m.group(1))
        ids = _iota(_ints(m.group(2)), _ints(m.group(3)) if m.group(3) else None)
        return tuple(map(tuple, ids.reshape(shape[0], -1).tolist()))
    m = _EXPLICIT.search(attrs)
    if m and m.group(1).strip():
        return _nested(m.group(1))
    return (tuple(range(num_devices)),)


_MOVES = ("bitcast", "reshape", "copy", "transpose", "get-tuple-element")  # change no values


def _dtype(instr: Instr | None) -> str:
    m = ARRAY.match(instr.shape) if instr is not None else None
    return m.group(1) if m else ""


def _root(instr: Instr, scope: dict[str, Instr], comps: dict[str, list[Instr]]) -> tuple[Instr | None, dict]:
    """The value-producing instruction behind `instr` (a fusion's root; bitcasts, copies... looked through)."""
    callee = CALLS.search(instr.attrs) if instr.opcode == "fusion" else None
    node = instr
    if callee and callee.group(1) in comps:
        scope = {i.name: i for i in comps[callee.group(1)]}
        node = next((i for i in comps[callee.group(1)] if i.root), None)
    while node is not None and node.opcode in _MOVES and node.operands:
        node = scope.get(node.operands[0])
    return node, scope


def _converted_to(name: str, dtype: str, instrs: list[Instr], comps: dict[str, list[Instr]]) -> bool:
    """Every use of `name` in `instrs` converts it to `dtype` (through async -done, moves and fusions)."""
    users = [(u, name) for u in instrs if name in u.operands]
    for user, via in users:
        if user.opcode.endswith("-done") or user.opcode in _MOVES:
            ok = _converted_to(user.name, dtype, instrs, comps)
        elif user.opcode == "convert":
            ok = _dtype(user) == dtype
        elif user.opcode == "fusion" and (callee := CALLS.search(user.attrs)):
            body = comps.get(callee.group(1), [])
            param = next(
                (i.name for i in body if i.opcode == "parameter" and i.args == str(user.operands.index(via))), None
            )
            ok = param is not None and _converted_to(param, dtype, body, comps)
        else:
            ok = False
        if not ok:
            return False
    return bool(users)


def payload_bytes(
    collective: Instr, operand: str, by_name: dict[str, Instr], comps: dict[str, list[Instr]], instrs: list[Instr]
) -> float:
    """Bytes of a collective operand in the dtype its values really have. XLA:CPU widens bf16 collectives to
    f32 (convert → collective → convert back), an accelerator does not: an operand that a widening `convert`
    produced from a narrower float and whose result is only ever converted back counts in that dtype."""
    instr = by_name.get(operand)
    if instr is None:
        return 0.0
    full = shape_bytes(instr.shape)
    node, scope = _root(instr, by_name, comps)
    if node is None or node.opcode != "convert" or not node.operands:
        return full
    narrow, wide = _dtype(scope.get(node.operands[0])), _dtype(node)
    floats = all(d == "bf16" or d.startswith("f") for d in (narrow, wide))
    if not floats or not 0 < DTYPE_BYTES.get(narrow, 0) < DTYPE_BYTES.get(wide, 0):
        return full
    if not _converted_to(collective.name, narrow, instrs, comps):
        return full  # the program really wants the wide values (e.g. a user's f32 gradient)
    return full * DTYPE_BYTES[narrow] / DTYPE_BYTES[wide]
