"""Optimized HLO text (`compiled.as_text()`) split into computations and instructions, and shape sizes.

The primitives `zaya_jax.planning.hlo_stats` (costs) and `zaya_jax.planning.hlo_collectives` (collectives) read it with.
"""

from __future__ import annotations

import dataclasses
import math
import re

DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "s4": 0.5,
    "u4": 0.5,
}

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
ARRAY = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
NAME = re.compile(r"%([\w.\-]+)")
CALLS = re.compile(r"calls=%?([\w.\-]+)")  # the computation(s) a fusion / call runs
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_GEMM_TARGET = re.compile(r"^__cublas\$")  # cuBLAS / cuBLASLt; hipBLASLt on ROCm uses the same names


@dataclasses.dataclass
class Instr:
    name: str
    shape: str  # result shape text (array or tuple)
    opcode: str
    operands: list[str]
    attrs: str
    args: str = ""  # raw text inside the opcode's parentheses (e.g. a constant's value)
    root: bool = False


def shape_bytes(shape: str) -> float:
    """Bytes of an array or tuple shape text, e.g. `f32[4,8]{1,0}` or `(bf16[2], s32[])`."""
    total = 0.0
    for dtype, dims in ARRAY.findall(shape):
        if dtype in DTYPE_BYTES:
            total += DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def shape_dims(shape: str) -> list[int]:
    m = ARRAY.search(shape)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _balanced(text: str, start: int) -> int:
    """Index just past the parenthesis group opening at text[start] == '('."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return len(text)


def _parse_instr(line: str) -> Instr | None:
    m = _INSTR.match(line)
    if not m:
        return None
    name, rest = m.group(1), m.group(2)
    if rest.startswith("("):
        end = _balanced(rest, 0)
        shape, rest = rest[:end], rest[end:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    op = re.match(r"([\w\-]+)\(", rest)
    if not op:
        return None
    end = _balanced(rest, op.end() - 1)
    args = rest[op.end() : end - 1]
    return Instr(name, shape, op.group(1), NAME.findall(args), rest[end:], args, line.lstrip().startswith("ROOT"))


def parse_computations(text: str) -> tuple[dict[str, list[Instr]], str]:
    """{computation name: instructions} and the ENTRY computation's name."""
    comps: dict[str, list[Instr]] = {}
    entry, current = "", None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            current = header.group(2)
            comps[current] = []
            if header.group(1):
                entry = current
        elif line.strip() == "}":
            current = None
        elif current is not None:
            instr = _parse_instr(line)
            if instr is not None:
                comps[current].append(instr)
    return comps, entry


def widened_parameter_bytes(text: str) -> float:
    """Bytes of fp32 copies XLA made of whole bf16 entry parameters (`convert`, or a fusion that is only a
    convert, of a bf16 parameter to f32 of the same dims).

    XLA:CPU has no bf16 kernels for some ops (batched matmuls among them): it converts their bf16 operands to
    fp32 and, for operands that are loop-invariant slices of a stacked parameter, hoists the conversion of the
    whole stack out of the layer loop. An accelerator with bf16 GEMMs keeps no such copy, so the planner
    reports them separately from the XLA:CPU peak.
    """
    comps, entry = parse_computations(text)
    params = {i.name: i.shape for i in comps.get(entry, []) if i.opcode == "parameter"}
    converts = {
        name for name, instrs in comps.items() if [i.opcode for i in instrs if i.opcode != "parameter"] == ["convert"]
    }
    total = 0.0
    for instrs in comps.values():
        for i in instrs:
            is_convert = i.opcode == "convert" or (
                i.opcode == "fusion" and any(f"calls=%{c}" in i.attrs or f"calls={c}" in i.attrs for c in converts)
            )
            if not is_convert or len(i.operands) != 1 or i.operands[0] not in params:
                continue
            source = params[i.operands[0]]
            if source.startswith("bf16") and i.shape.startswith("f32") and shape_dims(source) == shape_dims(i.shape):
                total += shape_bytes(i.shape)
    return total


def op_name(instr: Instr) -> str:
    """The JAX op_name metadata of an instruction ('' when it has none)."""
    m = _OP_NAME.search(instr.attrs)
    return m.group(1) if m else ""


def call_target(instr: Instr) -> str:
    """A custom call's `custom_call_target` ('' for any other instruction)."""
    m = _TARGET.search(instr.attrs) if instr.opcode == "custom-call" else None
    return m.group(1) if m else ""


def gemm_call(instr: Instr) -> str:
    """ "dense" for a GPU GEMM library call (`__cublas$gemm`, `__cublas$lt$matmul`; its result is a tuple
    (product, s8 workspace)), "grouped" for a grouped one (`__cublas$lt$groupedMatmul`: each group runs only the
    rows routed to it, known at run time), "" for anything else."""
    target = call_target(instr)
    if not _GEMM_TARGET.match(target):
        return ""
    return "grouped" if "grouped" in target.lower() else "dense"
