"""Plan a training run on an emulated CPU mesh: memory per device, FLOPs (XLA vs analytic), collective bytes
and a projected step time / MFU on the paper's cluster — from abstract shapes, nothing allocated.

    python -m launch.plan --config=experiments/zaya1_base.py --mesh=data:8 --seq_len=4096
    python -m launch.plan --config=experiments/zaya1_base.py --mesh=data:8 --seq_len=4096 --remat=auto --out=plan.json
    python -m launch.plan --config=experiments/zaya1_base.py --mesh=data:8 --compile_scaling
    python -m launch.plan --config=experiments/zaya1_base.py --mesh=context:8 --seq_len=32768  # context-parallel CCA
    python -m launch.plan --config=experiments/zaya1_base.py --seq_len=4096 --microbatches=8 \
        --sweep=data:8,64,128,1024 --out=plan_sweep   # scaling curve: sweep.csv + sweep.png
    python -m launch.plan --config=experiments/zaya1_base.py --seq_len=4096 --microbatches=8 \
        --search --target=mi300x --nodes=128   # the fastest layout for 128 x 8 MI300X (launch.plan_search)

The report ends with five lines: executed / analytic hardware FLOPs, optimizer / Newton-Schulz FLOPs,
collective wire / ZeRO-1 minimum, projected MFU (compute + memory-bound + collectives, not overlapped, on the
cluster model of `zaya_jax.planning.cluster`, whose assumptions are printed and set by the --gpus_per_node,
--nic_gbps, --nic_efficiency, --xgmi_link_gbps, --alpha_xgmi_us, --alpha_nic_us, --hbm_efficiency flags),
and projected MFU (overlapped): the same with each collective hidden up to the compute of the loop body it is
issued in (`zaya_jax.planning.overlap`).

Context parallelism: `--config.mesh.context_layout=zigzag` plans the load-balanced layout
(`zaya_jax.model.cca_context`).

`--remat=auto` tries none → dots → full and reports the first policy whose peak fits
`--usable_memory_fraction` of the device memory. `--compile_scaling` compiles the train step of the config at
a small width for 8 / 40 / 80 layers and reports compile times and HLO sizes (the layers are scanned, so the
80-layer program must cost < 1.5× the 8-layer one). See `zaya_jax/planning/plan.py` for where every number comes from.
"""

from launch.cpu_devices import prepare_host

prepare_host()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the plan is made on the (emulated) CPU mesh

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import cli, cpu_devices  # noqa: E402
from zaya_jax.config import PARAM_SHARDINGS, REMAT_POLICIES, ConfigError, validate  # noqa: E402
from zaya_jax.parallel.mesh import parse_mesh_spec  # noqa: E402
from zaya_jax.planning.abstract_step import planning_config  # noqa: E402
from zaya_jax.planning.cluster import Cluster  # noqa: E402
from zaya_jax.planning.compile_scaling import compile_scaling, small_width  # noqa: E402
from zaya_jax.planning.plan import plan, plan_auto_remat  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (experiments/*.py).", lock_config=True
)
flags.DEFINE_string("mesh", None, "mesh sizes, e.g. data:8 or data:2,expert:4 (default: the config's mesh)")
flags.DEFINE_integer("seq_len", None, "sequence length (default: config.train.seq_len)")
flags.DEFINE_integer("batch_per_device", 1, "sequences per batch shard (data × expert) per micro-batch")
flags.DEFINE_integer("microbatches", None, "gradient-accumulation micro-batches (default: the config's)")
flags.DEFINE_string("hardware", "mi300x", "target accelerator (zaya_jax.hardware.HARDWARE)")
flags.DEFINE_string(
    "target",
    None,
    "also compile the planned step with the GPU compiler for this GPU (h100, h200, mi300x, mi325x; the gpu-compile "
    "extra) on the planned mesh (nodes of --gpus_per_node): its peak per device decides the verdict",
)
flags.DEFINE_enum(
    "remat",
    None,
    [*REMAT_POLICIES, "auto"],
    "remat policy (default: the config's); auto = first of none, dots, full that fits",
)
flags.DEFINE_enum("param_sharding", None, list(PARAM_SHARDINGS), "default: the config's")
flags.DEFINE_string(
    "dispatch",
    "auto",
    "MoE dispatch for planning: auto (per-device 'ep'), config (keep), or dense | dropless | capacity | ep | ep_ragged "
    "(planned as ep at its capacity factor)",
)
flags.DEFINE_float(
    "capacity_factor",
    1.0,
    "capacity factor for planning (0 = the config's); 1.0 sizes the expert buffers like a dropless grouped GEMM",
)
flags.DEFINE_integer("gpus_per_node", 8, "GPUs per node on xGMI (cluster model)")
flags.DEFINE_integer("xgmi_links", 7, "xGMI links per GPU (>= gpus_per_node - 1: fully connected node)")
flags.DEFINE_float("xgmi_link_gbps", 48.0, "achieved GB/s per xGMI link and direction")
flags.DEFINE_float("nic_gbps", 50.0, "NIC line rate per GPU in GB/s (Pollara 400 = 50)")
flags.DEFINE_float("nic_efficiency", 0.9, "achieved fraction of the NIC line rate")
flags.DEFINE_float("alpha_xgmi_us", 5.0, "latency per intra-node collective step, microseconds")
flags.DEFINE_float("alpha_nic_us", 10.0, "latency per inter-node collective step, microseconds")
flags.DEFINE_float("hbm_efficiency", 0.8, "achieved fraction of peak HBM bandwidth for memory-bound passes")
flags.DEFINE_string(
    "sweep",
    None,
    "plan several meshes, e.g. data:8,64,128,1024 (one process each, "
    "--cpu_devices = the mesh size); writes sweep.csv and sweep.png into --out",
)
flags.DEFINE_float("usable_memory_fraction", 0.95, "fraction of device memory the step may use")
flags.DEFINE_bool("fast_compile", True, "skip LLVM optimisation (HLO, buffers and costs are unchanged)")
flags.DEFINE_bool("compile_scaling", False, "measure compile time / HLO size for --scaling_depths instead")
flags.DEFINE_list("scaling_depths", ["8", "40", "80"], "depths for --compile_scaling")
flags.DEFINE_string("out", None, "write the result as JSON here (with --sweep: the output folder, default plan_sweep)")
flags.DEFINE_bool(
    "search", False, "search the fastest layout for --nodes x --gpus_per_node devices (launch.plan_search)"
)
flags.DEFINE_integer("nodes", None, "--search: nodes of the cluster (devices = nodes x --gpus_per_node)")
flags.DEFINE_integer("search_budget", 24, "--search: at most this many new compiles (cached plans are free)")
flags.DEFINE_string("search_cache", "~/.cache/zaya_jax/plans", "--search: folder of cached plans ('' = no cache)")
flags.DEFINE_float("max_dropped", 0.01, "--search: expected fraction of routed tokens expert parallelism may drop")
flags.DEFINE_float(
    "expert_load_cv",
    0.3,
    "--search: global expert-load CV the capacity is sized for (a run's moe/max_load_cv; 0.3 = balanced, "
    "about 1 for a fresh router's first steps)",
)
flags.DEFINE_integer("search_gpu_top", 2, "--search with --target: GPU-compile this many of the best layouts")
cpu_devices.define_flag(8, "emulated CPU devices (wins over XLA_FLAGS' device count)")
# every number checked while the flags are parsed: one line, exit 78, before anything is traced or compiled
cli.require_numbers("seq_len", "batch_per_device", "microbatches", "gpus_per_node", "nodes", minimum=1)
cli.require_numbers("search_budget", "search_gpu_top", "expert_load_cv", minimum=0)
cli.require_numbers("max_dropped", above=0, maximum=1)
cli.require_numbers("xgmi_links", "capacity_factor", "alpha_xgmi_us", "alpha_nic_us", minimum=0)
cli.require_numbers("xgmi_link_gbps", "nic_gbps", above=0)
cli.require_numbers("nic_efficiency", "hbm_efficiency", "usable_memory_fraction", above=0, maximum=1)
FLAGS = flags.FLAGS
GB = 1e9


def _fmt_bytes(x: float) -> str:
    return f"{x / GB:9.2f} GB" if x >= 0.1 * GB else f"{x / 1e6:9.2f} MB"


def format_plan(r: dict) -> str:
    """Human-readable report of `zaya_jax.planning.plan.plan` output."""
    s, mem, fl = r["setup"], r["memory"], r["flops"]
    a = fl["analytic"]
    lines = [
        f"setup: mesh {s['mesh']} ({s['devices']} devices), seq {s['seq_len']}, global batch {s['global_batch']} "
        f"({s['tokens_per_step']:,} tokens/step, {s['microbatches']} micro-batch), {s['num_layers']} layers, "
        f"remat={s['remat']}, params={s['param_sharding']} ({s['param_dtype']}, compute {s['dtype']}), "
        f"dispatch={s['dispatch']} cf={s['capacity_factor']}"
        + (
            " (ep_ragged's upper bound: a full receive buffer on every device)"
            if s.get("dispatch_planned_for") == "ep_ragged"
            else ""
        ),
        f"compile: lower {s['lower_s']:.1f} s, compile {s['compile_s']:.1f} s (fast={s['fast_compile']}), "
        f"HLO {s['hlo_instructions']:,} instructions, loop trip counts {s['loop_trip_counts']}",
        "",
        "memory per device (compiled.memory_analysis + analytic sharded shapes):",
        f"  parameters          {_fmt_bytes(mem['params'])}   (analytic, sharded shapes)",
        f"  optimizer state     {_fmt_bytes(mem['opt_state'])}   (analytic, sharded shapes)",
        f"  other state         {_fmt_bytes(mem['other_state'])}",
        f"  arguments (XLA)     {_fmt_bytes(mem['argument'])}   donated/aliased {_fmt_bytes(mem['alias'])}",
        f"  temporaries (XLA)   {_fmt_bytes(mem['temp'])}   (activations kept for backward, gradients, workspace; "
        f"all gradients unsharded would be {mem['gradients_unsharded'] / GB:.2f} GB)",
        f"  peak = args + outputs - aliased + temps = {mem['peak'] / GB:.2f} GB  vs  usable "
        f"{mem['usable'] / GB:.1f} GB of {mem['capacity'] / GB:.0f} GB -> {'FITS' if r['fits'] else 'DOES NOT FIT'}",
        f"  of which fp32 copies of bf16 parameters that only XLA:CPU makes {mem['cpu_fp32_param_copies'] / GB:.2f} GB"
        f" -> on a bf16 accelerator about {mem['peak_without_cpu_copies'] / GB:.2f} GB",
        "",
        "FLOPs per step (global = per device × devices; XLA counts one SPMD partition):",
        f"  XLA cost_analysis flops per device   {fl['xla_cost_analysis_per_device']:.4g}  (while bodies counted ONCE)",
        f"  ... with loop trip counts applied    {fl['xla_cost_analysis_loop_corrected_per_device']:.4g}",
        f"  HLO dot FLOPs per device (trip counts) {fl['hlo_dot_per_device']:.4g}  -> global {fl['hlo_dot_total']:.4g}",
        f"  analytic model 6·N_active·T + causal attention  {a['model']:.4g}",
        f"    + masked part of attention           {a['attention_masked_half']:.4g}",
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
        "",
        "collectives per step per device (HLO operand bytes × trip counts, a conditional = its costliest branch; "
        "wire = busbw factors):",
    ]
    for kind, c in r["collectives"].items():
        lines.append(
            f"  {kind:20s} {c['count']:6d} ops  operands {_fmt_bytes(c['operand_bytes'])}  "
            f"wire {_fmt_bytes(c['wire_bytes'])}"
        )
    lines += [
        f"  total operands {_fmt_bytes(r['collective_bytes_per_device'])}, wire "
        f"{_fmt_bytes(r['collective_wire_bytes_per_device'])}",
    ]
    lines += format_projection(r)
    if "remat_auto" in r:
        ra = r["remat_auto"]
        tried = ", ".join(
            f"{t['remat']}: {t['peak'] / GB:.1f} GB {'fits' if t['fits'] else 'no'}" for t in ra["attempts"]
        )
        lines += [
            "",
            f"remat=auto: {tried} -> " + (f"needed: remat={ra['chosen']}" if ra["chosen"] else "nothing fits"),
        ]
    gpu = r.get("gpu_compiled")
    if gpu is not None:
        from launch.plan_gpu import format_gpu_compiled

        lines += ["", *format_gpu_compiled(r)]
    peak = mem.get("peak_gpu_compiled", mem["peak"])
    which = "GPU-compiled peak" if "peak_gpu_compiled" in mem else "peak"
    verdict = (
        f"VERDICT: fits {mem['capacity'] / GB:.0f} GB per {r['projection']['hardware']} "
        f"({which} {peak / GB:.1f} GB <= {mem['usable'] / GB:.1f} GB usable) with remat={s['remat']}"
        if r["fits"]
        else f"VERDICT: does NOT fit with remat={s['remat']} "
        f"({which} {peak / GB:.1f} GB > {mem['usable'] / GB:.1f} GB usable)"
        + (" or the GPU compile failed" if gpu is not None and not gpu["ok"] else "")
    )
    return "\n".join(lines + ["", verdict] + summary_lines(r))


def summary_lines(r: dict) -> list[str]:
    """The five closing lines of every plan."""
    su = r["summary"]
    return [
        f"executed / analytic hardware FLOPs: {su['executed_over_analytic_hardware_flops']:.2f}",
        f"optimizer / Newton-Schulz FLOPs: {su['optimizer_over_newton_schulz_flops']:.2f}",
        f"collective wire / ZeRO-1 minimum: {su['collective_wire_over_zero1_minimum']:.2f}",
        f"projected MFU: {100 * su['projected_mfu']:.1f}%",
        f"projected MFU (overlapped): {100 * su['projected_mfu_overlapped']:.1f}%",
    ]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def format_projection(r: dict) -> list[str]:
    """Cluster assumptions, the analytic HBM bytes and ZeRO-1 minimum, and the projected step time."""
    p = r["projection"]
    pr, ideal, hb, zm = p["projected"], p["ideal"], p["hbm_bytes"], p["zero1_minimum_wire_bytes"]
    parts = lambda d: ", ".join(
        f"{k.replace('_', ' ')} {_fmt_bytes(v).strip()}"  # noqa: E731
        for k, v in d.items()
        if k != "total" and v
    )
    kinds = ", ".join(f"{k} {_ms(v)}" for k, v in pr["collective_by_kind_s"].items())
    s = r["setup"]
    return [
        "",
        f"projection on {p['hardware']} ({p['peak_flops'] / 1e12:.0f} TFLOP/s bf16 peak for every executed "
        f"FLOP, {p['hbm_bandwidth'] / 1e12:.1f} TB/s HBM peak); cluster assumptions:",
        *(f"  - {line}" for line in p["assumptions"]),
        f"  - grad_reduce_dtype {s.get('grad_reduce_dtype', 'float32')}, compute dtype {s['dtype']}; "
        "memory-bound bytes from the analytic model of zaya_jax/planning/projection.py",
        f"  compute        {_ms(pr['compute_s'])}  (executed HLO dot FLOPs per device / peak)",
        f"  memory-bound   {_ms(pr['memory_s'])}  for {_fmt_bytes(hb['total']).strip()}: "
        f"{parts({k: v for k, v in hb.items() if k != 'newton_schulz_operands'})} (of "
        f"{_fmt_bytes(hb['newton_schulz_operands']).strip()} Newton-Schulz operands, the rest hides under its GEMMs)",
        f"                 (XLA:CPU program traffic {_fmt_bytes(p['xla_cpu_hbm_bytes_upper_bound']).strip()} -> "
        f"{_ms(p['xla_cpu_memory_s_upper_bound'])}: an upper bound only, fusion-poor)",
        f"  collectives    {_ms(pr['collective_s'])}  = latency {_ms(pr['collective_latency_s'])} + xGMI "
        f"{_ms(pr['collective_xgmi_s'])} + network {_ms(pr['collective_nic_s'])}; by kind: {kinds}",
        f"  step = compute + memory-bound + collectives (not overlapped) = {_ms(pr['step_s'])} -> "
        f"{pr['tokens_per_s_per_device']:,.0f} tokens/s/device, MFU {pr['mfu']:.1%}",
        *format_overlap(p),
        f"  ZeRO-1 minimum wire per device: {_fmt_bytes(zm['total']).strip()} ({parts(zm)}) vs compiled "
        f"{_fmt_bytes(r['collective_wire_bytes_per_device']).strip()}",
        f"  at the minimum (analytic FLOPs, Newton-Schulz balanced over devices, minimum collectives on the "
        f"cluster): step {_ms(ideal['step_s'])} (compute {_ms(ideal['compute_s'])}, memory {_ms(ideal['memory_s'])}, "
        f"collectives {_ms(ideal['collective_s'])}) -> {ideal['tokens_per_s_per_device']:,.0f} tokens/s/device, "
        f"MFU {ideal['mfu']:.1%}",
    ]


def format_overlap(p: dict) -> list[str]:
    """The overlapped step: assumptions, then per computation with collectives what hides and what not."""
    ov = p["overlapped"]
    lines = ["  overlapped step (zaya_jax/planning/overlap.py):", *(f"    - {a}" for a in p["overlap_assumptions"])]
    for b in ov["bodies"][:6]:
        where = "loop body" if b["loop"] else "top level / branch"
        lines.append(
            f"    {b['computation'][:40]:40s} {where:18s} x{b['runs']:<6.0f} ({b['trips']} trips) "
            f"collectives {_ms(b['collective_s'])}"
            f" vs compute {_ms(b['compute_s'])} per run: hidden {_ms(b['hidden_s'])}, exposed {_ms(b['exposed_s'])}"
        )
    lines.append(
        f"  step = compute + memory-bound + exposed collectives {_ms(ov['exposed_s'])} (hidden {_ms(ov['hidden_s'])})"
        f" = {_ms(ov['step_s'])} -> {ov['tokens_per_s_per_device']:,.0f} tokens/s/device, MFU {ov['mfu']:.1%}"
    )
    return lines


def _cluster():
    try:
        return Cluster(
            gpus_per_node=FLAGS.gpus_per_node,
            xgmi_links=FLAGS.xgmi_links,
            xgmi_link_bandwidth=FLAGS.xgmi_link_gbps * 1e9,
            nic_bandwidth=FLAGS.nic_gbps * 1e9,
            nic_efficiency=FLAGS.nic_efficiency,
            alpha_xgmi=FLAGS.alpha_xgmi_us * 1e-6,
            alpha_nic=FLAGS.alpha_nic_us * 1e-6,
            hbm_efficiency=FLAGS.hbm_efficiency,
        )
    except ValueError as err:
        cli.fail("plan", str(err))


def _check_out_file(path: str) -> None:
    """`--out` (without --sweep): a file that can be written, checked before any planning (minutes of compiling)."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        cli.fail("plan", f"--out={path} is a directory; pass a file name for the JSON result")
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        cli.fail("plan", f"--out={path}: {parent} is not a writable directory")


def _gpu_target():
    """The `--target` GPU (None without the flag); one line, exit 78, when unknown or its extra is missing."""
    if not FLAGS.target:
        return None
    from zaya_jax.planning import gpu_target

    try:
        target = gpu_target.get_target(FLAGS.target)
    except ConfigError as err:
        cli.fail("plan", f"--target: {err}")
    if FLAGS.sweep or FLAGS.compile_scaling:
        cli.fail("plan", "--target compiles one planned step: leave out --sweep / --compile_scaling")
    if FLAGS["hardware"].present and FLAGS.hardware != target.hardware:
        cli.fail(
            "plan",
            f"--hardware={FLAGS.hardware} and --target={target.name} ({target.hardware}) name different devices; "
            "leave out --hardware (it follows --target) or make them agree",
        )
    reason = gpu_target.missing_extra(target.platform)
    if reason:
        cli.fail("plan", f"--target={FLAGS.target}: {reason}")
    FLAGS.hardware = target.hardware  # the estimate and the projection for the same device
    return target


def _check_target_topology(cfg) -> None:
    """--target: the planned mesh fills nodes of --gpus_per_node (one line, exit 78, before minutes of planning)."""
    import jax

    from launch.plan_gpu import topology
    from zaya_jax.parallel.mesh import resolve_mesh_shape

    try:
        sizes = resolve_mesh_shape(cfg.mesh, jax.device_count())
        n = 1
        for size in sizes.values():
            n *= size
        topology(n, FLAGS.gpus_per_node)
    except (ConfigError, ValueError) as err:
        cli.fail("plan", str(err))


def main(argv):
    del argv
    if FLAGS.out and not FLAGS.sweep:
        _check_out_file(FLAGS.out)
    if FLAGS.search:
        from launch import plan_search

        target, no_gpu_compile = plan_search.prepare(FLAGS)
    else:
        target = _gpu_target()
    config = validate(_CONFIG.value)
    dispatch = None if FLAGS.dispatch == "config" else FLAGS.dispatch
    remat = None if FLAGS.remat in (None, "auto") else FLAGS.remat
    mesh_text = None if FLAGS.sweep else FLAGS.mesh  # a sweep sets the mesh of every point itself
    try:
        cfg, notes = planning_config(
            config,
            mesh=parse_mesh_spec(mesh_text) if mesh_text else None,
            seq_len=FLAGS.seq_len,
            batch_per_device=FLAGS.batch_per_device,
            microbatches=FLAGS.microbatches,
            remat=remat,
            param_sharding=FLAGS.param_sharding,
            dispatch=dispatch,
            capacity_factor=FLAGS.capacity_factor or None,
        )
    except ConfigError as err:
        cli.fail("plan", str(err))
    if target is not None and not FLAGS.search:
        _check_target_topology(cfg)
    for note in notes:
        print(f"note: {note}")
    if FLAGS.search:
        plan_search.main(FLAGS, cfg, target, no_gpu_compile, _cluster())
        return
    if FLAGS.sweep:
        from launch.plan_sweep import run_sweep

        try:
            name = os.path.basename(config_flags.get_config_filename(FLAGS["config"]))
            run_sweep(
                FLAGS.sweep,
                sys.argv[1:],
                FLAGS.out or "plan_sweep",
                FLAGS.gpus_per_node,
                f"{name}: seq {cfg.train.seq_len}, {cfg.train.microbatches} micro-batch(es), remat={cfg.model.remat}",
            )
        except ValueError as err:
            cli.fail("plan", str(err))
        return
    if FLAGS.compile_scaling:
        cli.compilation_cache("none")  # compile times are what it measures: no persistent cache hits
        result = compile_scaling(small_width(cfg), tuple(int(d) for d in FLAGS.scaling_depths), fast_compile=False)
        for row in result["rows"]:
            print(json.dumps(row))
        print("ratios last/first depth:", json.dumps({k: round(v, 3) for k, v in result["ratios"].items()}))
    else:
        kwargs = dict(
            hardware=FLAGS.hardware,
            cluster=_cluster(),
            usable_fraction=FLAGS.usable_memory_fraction,
            fast_compile=FLAGS.fast_compile,
        )
        result = plan_auto_remat(cfg, **kwargs) if FLAGS.remat == "auto" else plan(cfg, **kwargs)
        result["notes"] = notes
        if target is not None:
            from launch.plan_gpu import gpu_compiled

            try:
                runs = (config.model.dispatch, config.model.capacity_factor)  # what launch.train runs
                gpu_compiled(cfg, result, target, FLAGS.gpus_per_node, runs)
            except ValueError as err:
                cli.fail("plan", str(err))
        print(format_plan(result))
    if FLAGS.out:
        with open(FLAGS.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, default=str)


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    cli.run(main, "plan")
