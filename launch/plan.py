"""Plan a training run on an emulated CPU mesh: memory per device, FLOPs (XLA vs analytic), collective bytes
and a roofline step time / MFU for the target hardware — from abstract shapes, nothing allocated.

    python -m launch.plan --config=experiments/zaya1_base.py --mesh=data:8 --seq=4096
    python -m launch.plan --config=experiments/zaya1_base.py --mesh=data:8 --seq=4096 --remat=auto --out=plan.json
    python -m launch.plan --config=experiments/zaya1_base.py --mesh=data:8 --compile_scaling
    python -m launch.plan --config=experiments/zaya1_base.py --mesh=context:8 --seq=32768  # context-parallel CCA

Context parallelism: `--config.mesh.context_layout=zigzag` plans the load-balanced layout (`zaya_jax.parallel.context`).

`--remat=auto` tries none → dots → full and reports the first policy whose peak fits
`--usable_memory_fraction` of the device memory. `--compile_scaling` compiles the train step of the config at
a small width for 8 / 40 / 80 layers and reports compile times and HLO sizes (the layers are scanned, so the
80-layer program must cost < 1.5× the 8-layer one). See `zaya_jax/plan.py` for where every number comes from.
"""

from launch.cpu_devices import emulate_from_argv

emulate_from_argv(default=8)  # before anything imports jax

import json  # noqa: E402
import os  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the plan is made on the (emulated) CPU mesh

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (experiments/*.py).",
                                          lock_config=True)
flags.DEFINE_string("mesh", None, "mesh sizes, e.g. data:8 or data:2,expert:4 (default: the config's mesh)")
flags.DEFINE_integer("seq", None, "sequence length (default: config.train.seq_len)")
flags.DEFINE_integer("batch_per_device", 1, "sequences per batch shard (data × expert) per micro-batch")
flags.DEFINE_integer("microbatches", None, "gradient-accumulation micro-batches (default: the config's)")
flags.DEFINE_string("hardware", "mi300x", "target accelerator (zaya_jax.sizing.HARDWARE)")
flags.DEFINE_enum("remat", None, ["none", "full", "dots", "dots_no_batch", "auto"],
                  "remat policy (default: the config's); auto = first of none, dots, full that fits")
flags.DEFINE_enum("param_sharding", None, ["zero1", "fsdp", "replicated"], "default: the config's")
flags.DEFINE_string("dispatch", "auto", "MoE dispatch for planning: auto (per-device 'ep'), config (keep), "
                                        "or dense | ragged | capacity | ep")
flags.DEFINE_float("capacity_factor", 1.0, "capacity factor for planning (0 = the config's); 1.0 sizes the "
                                           "expert buffers like a dropless grouped GEMM")
flags.DEFINE_float("link_gbps", 0.0, "per-device collective bandwidth in GB/s (0: xGMI 336 for <= 8 devices, "
                                     "else Pollara 50)")
flags.DEFINE_float("usable_memory_fraction", 0.95, "fraction of device memory the step may use")
flags.DEFINE_bool("fast_compile", True, "skip LLVM optimisation (HLO, buffers and costs are unchanged)")
flags.DEFINE_bool("compile_scaling", False, "measure compile time / HLO size for --scaling_depths instead")
flags.DEFINE_list("scaling_depths", ["8", "40", "80"], "depths for --compile_scaling")
flags.DEFINE_string("out", None, "write the result as JSON here")
flags.DEFINE_integer("cpu_devices", 8, "emulated CPU devices (read from argv before jax is imported)")
FLAGS = flags.FLAGS
GB = 1e9


def _fmt_bytes(x: float) -> str:
    return f"{x / GB:9.2f} GB" if x >= 0.1 * GB else f"{x / 1e6:9.2f} MB"


def format_plan(r: dict) -> str:
    """Human-readable report of `zaya_jax.plan.plan` output."""
    s, mem, fl, rf = r["setup"], r["memory"], r["flops"], r["roofline"]
    a = fl["analytic"]
    lines = [
        f"setup: mesh {s['mesh']} ({s['devices']} devices), seq {s['seq_len']}, global batch {s['global_batch']} "
        f"({s['tokens_per_step']:,} tokens/step, {s['microbatches']} micro-batch), {s['num_layers']} layers, "
        f"remat={s['remat']}, params={s['param_sharding']} ({s['param_dtype']}, compute {s['dtype']}), "
        f"dispatch={s['dispatch']} cf={s['capacity_factor']}",
        f"compile: lower {s['lower_s']:.1f} s, compile {s['compile_s']:.1f} s (fast={s['fast_compile']}), "
        f"HLO {s['hlo_instructions']:,} instructions, loop trip counts {s['loop_trip_counts']}",
        "", "memory per device (compiled.memory_analysis + analytic sharded shapes):",
        f"  parameters          {_fmt_bytes(mem['params'])}   (analytic, sharded shapes)",
        f"  optimizer state     {_fmt_bytes(mem['opt_state'])}   (analytic, sharded shapes)",
        f"  other state         {_fmt_bytes(mem['other_state'])}",
        f"  arguments (XLA)     {_fmt_bytes(mem['argument'])}   donated/aliased {_fmt_bytes(mem['alias'])}",
        f"  temporaries (XLA)   {_fmt_bytes(mem['temp'])}   (activations kept for backward, gradients, workspace; "
        f"all gradients unsharded would be {mem['gradients_unsharded'] / GB:.2f} GB)",
        f"  peak = args + outputs - aliased + temps = {mem['peak'] / GB:.2f} GB  vs  usable "
        f"{mem['usable'] / GB:.1f} GB of {mem['capacity'] / GB:.0f} GB -> {'FITS' if r['fits'] else 'DOES NOT FIT'}",
        "", "FLOPs per step (global = per device × devices; XLA counts one SPMD partition):",
        f"  XLA cost_analysis flops per device   {fl['xla_cost_analysis_per_device']:.4g}  (while bodies counted ONCE)",
        f"  ... with loop trip counts applied    {fl['xla_cost_analysis_loop_corrected_per_device']:.4g}",
        f"  HLO dot FLOPs per device (trip counts) {fl['hlo_dot_per_device']:.4g}  -> global {fl['hlo_dot_total']:.4g}",
        f"  analytic model 6·N_active·T + causal attention  {a['model']:.4g}",
        f"    + masked upper triangle of attention {a['attention_masked_half']:.4g}",
        f"    + expert capacity padding            {a['expert_capacity_padding']:.4g}",
        f"    + remat recompute                    {a['remat_recompute']:.4g}",
        f"    + Muon Newton-Schulz (optimizer)     {a['muon_newton_schulz']:.4g}",
        f"    = analytic hardware FLOPs            {a['hardware']:.4g}",
        f"  XLA / analytic hardware = {fl['xla_over_analytic_hardware']:.4f}; by part (HLO op_name metadata):",
        f"    forward+backward (under jvp): XLA {fl['hlo_dot_forward_backward']:.4g} / analytic "
        f"{a['model'] + a['attention_masked_half'] + a['expert_capacity_padding'] + a['remat_recompute']:.4g} = "
        f"{fl['forward_backward_over_analytic']:.4f}",
        f"    optimizer (the rest):         XLA {fl['hlo_dot_optimizer']:.4g} / Newton-Schulz "
        f"{a['muon_newton_schulz']:.4g} = {fl['optimizer_over_analytic_ns']:.4f}",
        f"  MODEL FLOPs: XLA forward+backward minus the listed extras {fl['xla_model']:.4g} vs analytic "
        f"{a['model']:.4g} -> ratio {fl['xla_model_over_analytic_model']:.4f}",
        "", "collectives per step per device (HLO operand bytes × trip counts; wire = busbw factors):",
    ]
    for kind, c in r["collectives"].items():
        lines.append(f"  {kind:20s} {c['count']:6d} ops  operands {_fmt_bytes(c['operand_bytes'])}  "
                     f"wire {_fmt_bytes(c['wire_bytes'])}")
    lines += [
        f"  total operands {_fmt_bytes(r['collective_bytes_per_device'])}, wire "
        f"{_fmt_bytes(r['collective_wire_bytes_per_device'])}",
        "", f"roofline on {rf['hardware']} ({rf['peak_flops'] / 1e12:.0f} TFLOP/s bf16, "
            f"{rf['hbm_bandwidth'] / 1e12:.1f} TB/s HBM, links {rf['link_bandwidth'] / GB:.0f} GB/s per device):",
        f"  compute {rf['compute_s'] * 1e3:.2f} ms; HBM {rf['memory_s'] * 1e3:.2f} ms for "
        f"{_fmt_bytes(rf['hbm_bytes_per_device']).strip()} "
        f"(XLA:CPU program traffic, upper bound) or {rf['memory_optimistic_s'] * 1e3:.2f} ms for 2 x peak footprint "
        f"(optimistic); collectives {rf['collective_s'] * 1e3:.2f} ms",
        f"  step = max(compute, HBM) + collectives = {rf['step_optimistic_s'] * 1e3:.2f} .. {rf['step_s'] * 1e3:.2f} ms"
        f" -> MFU {rf['mfu_optimistic']:.1%} .. {rf['mfu']:.1%}, {rf['tokens_per_s_per_device_optimistic']:,.0f} .. "
        f"{rf['tokens_per_s_per_device']:,.0f} tokens/s/device",
        f"  (collectives fully overlapped, optimistic HBM: {rf['step_overlapped_s'] * 1e3:.2f} ms, "
        f"MFU {rf['mfu_overlapped']:.1%})",
    ]
    if "remat_auto" in r:
        ra = r["remat_auto"]
        tried = ", ".join(f"{t['remat']}: {t['peak'] / GB:.1f} GB {'fits' if t['fits'] else 'no'}"
                          for t in ra["attempts"])
        lines += ["", f"remat=auto: {tried} -> "
                      + (f"needed: remat={ra['chosen']}" if ra["chosen"] else "nothing fits")]
    verdict = (f"VERDICT: fits {mem['capacity'] / GB:.0f} GB per {rf['hardware']} "
               f"(peak {mem['peak'] / GB:.1f} GB <= {mem['usable'] / GB:.1f} GB usable) with remat={s['remat']}"
               if r["fits"] else f"VERDICT: does NOT fit with remat={s['remat']} "
                                 f"(peak {mem['peak'] / GB:.1f} GB > {mem['usable'] / GB:.1f} GB usable)")
    return "\n".join(lines + ["", verdict])


def main(argv):
    del argv
    from zaya_jax import plan as planner
    from zaya_jax.config import ConfigError, validate

    config = validate(_CONFIG.value)
    dispatch = None if FLAGS.dispatch == "config" else FLAGS.dispatch
    remat = None if FLAGS.remat in (None, "auto") else FLAGS.remat
    try:
        cfg, notes = planner.planning_config(
            config, mesh=planner.parse_mesh(FLAGS.mesh) if FLAGS.mesh else None, seq_len=FLAGS.seq,
            batch_per_device=FLAGS.batch_per_device, microbatches=FLAGS.microbatches, remat=remat,
            param_sharding=FLAGS.param_sharding, dispatch=dispatch, capacity_factor=FLAGS.capacity_factor or None)
    except ConfigError as err:
        raise SystemExit(f"plan: error: {err}") from None
    for note in notes:
        print(f"note: {note}")
    if FLAGS.compile_scaling:
        result = planner.compile_scaling(planner.small_width(cfg), tuple(int(d) for d in FLAGS.scaling_depths),
                                         fast_compile=False)
        for row in result["rows"]:
            print(json.dumps(row))
        print("ratios last/first depth:", json.dumps({k: round(v, 3) for k, v in result["ratios"].items()}))
    else:
        kwargs = dict(hardware=FLAGS.hardware, link_bandwidth=FLAGS.link_gbps * 1e9 or None,
                      usable_fraction=FLAGS.usable_memory_fraction, fast_compile=FLAGS.fast_compile)
        result = (planner.plan_auto_remat(cfg, **kwargs) if FLAGS.remat == "auto" else planner.plan(cfg, **kwargs))
        result["notes"] = notes
        print(format_plan(result))
    if FLAGS.out:
        with open(FLAGS.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, default=str)


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main)
