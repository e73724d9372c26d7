"""What a GPU-compiled step is made of, read from its scheduled HLO (`compiled.as_text()` of a deviceless compile,
`zaya_jax.planning.gpu_compile`; docs/planner.md "Compiling for a GPU without one").

* kernels: fusions, custom calls (by target: cuBLAS / hipBLASLt GEMMs, cuDNN attention, ...) and dots;
* expert GEMMs: every dot or GEMM call whose JAX op_name is in the `experts` scope (the expert SwiGLU, dropless
  or over capacity slots) or comes from `ragged_dot`, and how XLA lowered it (`_expert_gemms`: a dense dot, a
  ragged-dot, a dense GEMM library call or a grouped one, `hlo_text.gemm_call`), or a kernel library's Pallas
  ragged-dot kernel (tokamax's Mosaic GPU / Triton kernels: grouped, like the grouped GEMM call);
* attention: cuDNN fused attention calls, and every buffer with two trailing dims equal to the sequence length
  (an `[.., S, S]` score matrix that a fused kernel never materialises);
* collectives in schedule order: each async `*-start` with what the latency-hiding scheduler put between it and
  its `*-done` (GEMMs, other fusions; a loop between counts with the GEMMs of its body, once each, e.g. the
  ZeRO-1 update's Newton–Schulz beside a layer chunk's all-gather), and the synchronous ones (XLA turns a
  start/done pair with nothing to hide into `is_sync`, or emits the plain op).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

from zaya_jax.planning.hlo_collectives import COLLECTIVES
from zaya_jax.planning.hlo_stats import callees
from zaya_jax.planning.hlo_text import CALLS, Instr, call_target, gemm_call, op_name, parse_computations, shape_dims

# op_name scopes (jax.named_scope) of the expert GEMMs (`model.experts.swiglu`, `Kernels.grouped_swiglu`) and of
# attention (`Kernels.causal_attention`); a backward op carries them inside `transpose(jvp(...))`
_EXPERT = re.compile(r"(^|[/(])experts([/)]|$)|ragged_dot")
_ATTENTION = re.compile(r"(^|[/(])attention([/)]|$)")
# Pallas kernels (Mosaic GPU, Triton) as custom calls; one whose op_name names a ragged dot (tokamax's
# `ragged_dot_sm90`, `ragged_contracting_dim_dot_sm90`) is a grouped GEMM: it runs only the routed rows
_PALLAS_TARGET = re.compile(r"^(mosaic_gpu|__gpu\$xla\.gpu\.triton)")


def is_expert(op_name: str) -> bool:
    return _EXPERT.search(op_name) is not None


@dataclasses.dataclass
class AsyncCollective:
    kind: str
    name: str
    computation: str
    sync: bool
    gemms_between: int = 0
    fusions_between: int = 0
    loops_between: int = 0  # while loops (their GEMMs are in gemms_between)


@dataclasses.dataclass
class GpuProgram:
    fusions: int
    custom_calls: dict[str, int]  # target → count
    dots: int
    # lowering → count: "dense dot", "ragged-dot" (left to the runtime), "dense GEMM call", "grouped GEMM call",
    # "grouped Pallas call"
    expert_gemms: dict[str, int]
    attention: str  # cudnn | pallas | xla
    square_buffers: list[str]  # instructions with an [.., S, S] result
    collectives: list[AsyncCollective]

    @property
    def async_collectives(self) -> list[AsyncCollective]:
        return [c for c in self.collectives if not c.sync]

    @property
    def sync_collectives(self) -> list[AsyncCollective]:
        return [c for c in self.collectives if c.sync]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {
            "async_with_gemms": sum(1 for c in self.async_collectives if c.gemms_between),
            "async": len(self.async_collectives),
            "sync": len(self.sync_collectives),
        }


def _contains(comp: str, comps: dict[str, list[Instr]], test, seen: set | None = None) -> bool:
    """Whether computation `comp` (or one it calls) has an instruction passing `test`."""
    seen = set() if seen is None else seen
    if comp in seen:
        return False
    seen.add(comp)
    for i in comps.get(comp, []):
        if test(i) or any(_contains(c, comps, test, seen) for c in CALLS.findall(i.attrs)):
            return True
    return False


def pallas_ragged_dot(instr: Instr) -> bool:
    """A Pallas kernel call (Mosaic GPU, Triton) of a ragged dot: a grouped GEMM (see `_PALLAS_TARGET`)."""
    return _PALLAS_TARGET.match(call_target(instr)) is not None and "ragged" in op_name(instr)


def is_gemm(instr: Instr, comps: dict[str, list[Instr]]) -> bool:
    """A GEMM kernel: a dot, a GEMM library call, a Pallas ragged dot, or a fusion around a dot (Triton GEMM)."""
    if instr.opcode == "dot" or gemm_call(instr) or pallas_ragged_dot(instr):
        return True
    callee = CALLS.search(instr.attrs)
    return instr.opcode == "fusion" and callee is not None and _contains(callee.group(1), comps, _is_dot)


def _is_dot(i: Instr) -> bool:
    return i.opcode in ("dot", "ragged-dot")


def _expert_gemms(comps: dict[str, list[Instr]]) -> Counter:
    out: Counter = Counter()
    for name, instrs in comps.items():
        for i in instrs:
            if not is_expert(op_name(i)):
                continue
            if i.opcode in ("dot", "ragged-dot"):
                out["dense dot" if i.opcode == "dot" else "ragged-dot"] += 1
            elif gemm_call(i):
                out[f"{gemm_call(i)} GEMM call"] += 1
            elif pallas_ragged_dot(i):
                out["grouped Pallas call"] += 1
    return out


def _square_buffers(instrs: list[Instr], comps: dict[str, list[Instr]], seq_len: int) -> list[str]:
    """Buffers the program materialises (results of top-level instructions) shaped [.., S, S] by attention ops
    (op_name under the `attention` scope of `Kernels.causal_attention`; a GEMM over a hidden size equal to S is
    not one)."""
    out = []
    for i in instrs:
        dims = shape_dims(i.shape)
        if seq_len <= 1 or len(dims) < 2 or dims[-1] != seq_len or dims[-2] != seq_len:
            continue
        callee = CALLS.search(i.attrs)
        names = [op_name(i)] + [op_name(j) for j in comps.get(callee.group(1), [])] if callee else [op_name(i)]
        if any(_ATTENTION.search(n) for n in names):
            out.append(f"{i.name} {i.shape.split('{')[0]}")
    return out


def _collective_kind(instr: Instr, comps: dict[str, list[Instr]]) -> str | None:
    op = instr.opcode
    if op.endswith("-start"):
        base = op[: -len("-start")]
        if base in COLLECTIVES:
            return base
        if base == "async":  # reduce-scatter / all-to-all wrapped in an async computation
            callee = CALLS.search(instr.attrs)
            for i in comps.get(callee.group(1), []) if callee else []:
                if i.opcode in COLLECTIVES:
                    return i.opcode
        return None
    return op if op in COLLECTIVES else None


def _schedule(comps: dict[str, list[Instr]], fused: set[str]) -> list[AsyncCollective]:
    """Collectives of every non-fused computation, in schedule (= text) order, with what lies between start/done."""
    out = []
    for comp, instrs in comps.items():
        if comp in fused:
            continue
        position = {i.name: k for k, i in enumerate(instrs)}
        for k, i in enumerate(instrs):
            kind = _collective_kind(i, comps)
            if kind is None:
                continue
            if not i.opcode.endswith("-start"):
                out.append(AsyncCollective(kind, i.name, comp, sync=True))
                continue
            done = next((j for j in instrs[k + 1 :] if j.opcode.endswith("-done") and i.name in j.operands), None)
            end = position[done.name] if done is not None else k + 1
            between = [j for j in instrs[k + 1 : end] if j.opcode not in _BOOKKEEPING]
            sync = '"is_sync":true' in i.attrs.replace(" ", "") or not between
            gemms = sum(1 for j in between if is_gemm(j, comps))
            fusions = sum(1 for j in between if j.opcode in ("fusion", "custom-call")) - gemms
            loops = [j for j in between if j.opcode == "while"]
            in_loops = sum(_gemms_inside(j, comps) for j in loops)
            out.append(AsyncCollective(kind, i.name, comp, sync, gemms + in_loops, max(fusions, 0), len(loops)))
    return out


def _gemms_inside(instr: Instr, comps: dict[str, list[Instr]], seen: set | None = None) -> int:
    """GEMM kernels in the computations a control-flow instruction (while, conditional, call) runs, once each."""
    seen = set() if seen is None else seen
    total = 0
    for comp, _ in callees(instr, comps):
        if comp in seen:
            continue
        seen.add(comp)
        for j in comps.get(comp, []):
            total += 1 if is_gemm(j, comps) else 0
            if j.opcode in ("while", "conditional", "call"):
                total += _gemms_inside(j, comps, seen)
    return total


_BOOKKEEPING = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "copy-start", "copy-done"})


def _attention(comps, targets: Counter) -> str:
    """Which attention kernel the program runs: `cudnn` (cuDNN's `__cudnn$fmha…` calls), `pallas` (a Triton call
    of Pallas's flash attention, `mha_forward` in its op name) or `xla` (einsums)."""
    if any("cudnn$fmha" in t for t in targets):
        return "cudnn"
    pallas = (i for instrs in comps.values() for i in instrs if call_target(i) == "__gpu$xla.gpu.triton")
    return "pallas" if any("mha_forward" in op_name(i) for i in pallas) else "xla"


def analyze_program(text: str, seq_len: int) -> GpuProgram:
    """Read the scheduled HLO `text` of a GPU-compiled step whose sequences are `seq_len` long."""
    comps, _ = parse_computations(text)
    fused = {c for instrs in comps.values() for i in instrs if i.opcode == "fusion" for c in CALLS.findall(i.attrs)}
    top = [i for name, instrs in comps.items() if name not in fused for i in instrs]
    targets = Counter(call_target(i) for instrs in comps.values() for i in instrs if i.opcode == "custom-call")
    dots = sum(1 for instrs in comps.values() for i in instrs if _is_dot(i))
    attention = _attention(comps, targets)
    return GpuProgram(
        fusions=sum(1 for i in top if i.opcode == "fusion"),
        custom_calls=dict(targets),
        dots=dots,
        expert_gemms=dict(_expert_gemms(comps)),
        attention=attention,
        square_buffers=_square_buffers([i for i in top if i.opcode not in _BOOKKEEPING], comps, seq_len),
        collectives=_schedule(comps, fused),
    )
