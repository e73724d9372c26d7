"""Compiling the step for a GPU without one (`zaya_jax.planning.gpu_compile`, `launch.gpu_check --compile`).

Every leg: the targets' data and flags, the scheduled-HLO reading on a hand-written module, the mesh over a
device list of another backend, and `launch.gpu_check`'s refusals (a file as --out, the full check without a GPU).
Tests marked `gpu_compile` run XLA's real GPU compiler (the `gpu-compile` extra, Python >= 3.12) for h100 and
mi300x; without the extra they skip and say why.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys

import jax
import pytest

from tests.tools import REPO
from zaya_jax.config import ConfigError, load_config
from zaya_jax.parallel.mesh import make_mesh
from zaya_jax.planning import gpu_program, gpu_target, hlo_stats, hlo_text
from zaya_jax.planning.abstract_step import planning_config

ENV = dict(os.environ, PYTHONPATH=REPO)


def test_mesh_keeps_the_device_list_it_is_given():
    """A list as long as jax.devices() but in another order (as a GPU topology's devices are) is not replaced."""
    config = load_config("experiments/zaya1.py:tiny")
    with config.unlocked():
        config.mesh.data, config.mesh.expert = 2, 4
    devices = list(reversed(jax.devices()))
    assert len(devices) == 8
    mesh = make_mesh(config, devices)
    assert [d.id for d in mesh.devices.reshape(-1)] == [d.id for d in devices]


def test_targets_flags_and_topologies():
    for name, target in gpu_target.TARGETS.items():
        text = open(target.config_file, encoding="utf-8").read()
        assert "device_memory_size" in text and target.platform.upper() in text, name
    for platform in ("rocm", "cuda"):  # one list: env.sh sets exactly the flags the compile check uses
        env = {k: v for k, v in ENV.items() if k != "XLA_FLAGS"}
        show = subprocess.run(
            ["bash", "-c", f'source launch/{platform}/env.sh && echo "$XLA_FLAGS"'],
            cwd=REPO, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert tuple(show.stdout.split()) == gpu_target.xla_flags(platform) and len(show.stdout.split()) > 5
    assert "--xla_gpu_experimental_use_ragged_dot_grouped_gemm=true" in gpu_target.xla_flags("rocm")
    options = gpu_target.compiler_options("rocm", ("--xla_gpu_enable_triton_gemm=true",))
    assert options["xla_gpu_autotune_level"] == 4 and options["xla_gpu_enable_triton_gemm"] is True
    assert options["xla_gpu_enable_command_buffer"] == ""
    assert [gpu_target._gcn_arch(gpu_target.get_target(n)) for n in ("mi300x", "mi325x")] == ["gfx942"] * 2
    assert gpu_target.topology_for({"data": 1}, None) == (1, 1)
    assert gpu_target.topology_for({"data": 64}, None) == (8, 8)
    assert gpu_target.topology_for({"data": -1}, 128) == (128, 8)
    with pytest.raises(ConfigError, match="choose from h100, h200, mi300x, mi325x"):
        gpu_target.get_target("a100")
    with pytest.raises(ConfigError, match="not a multiple of 8"):
        gpu_target.topology_for({"data": 12}, None)


SCHEDULED = """HloModule step, is_scheduled=true

%gemm_body (p0: bf16[8,16], p1: bf16[16,4]) -> f32[8,4] {
  %p0 = bf16[8,16]{1,0} parameter(0)
  %p1 = bf16[16,4]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/jvp(experts)/dot_general"}
}

%add_body (q0: f32[8,4]) -> f32[8,4] {
  %q0 = f32[8,4]{1,0} parameter(0)
  ROOT %add.1 = f32[8,4]{1,0} add(%q0, %q0)
}

%score_body (r0: f32[2,64,64]) -> f32[2,64,64] {
  %r0 = f32[2,64,64]{2,1,0} parameter(0)
  ROOT %exp.1 = f32[2,64,64]{2,1,0} exponential(%r0), metadata={op_name="jit(step)/transpose(jvp(attention))/exp"}
}

ENTRY %main (a: bf16[8,16], b: bf16[16,4], g: f32[64], s: f32[2,64,64], x: f32[64,32], y: f32[32,64]) -> f32[8,4] {
  %a = bf16[8,16]{1,0} parameter(0)
  %b = bf16[16,4]{1,0} parameter(1)
  %g = f32[64]{0} parameter(2)
  %s = f32[2,64,64]{2,1,0} parameter(3)
  %x = f32[64,32]{1,0} parameter(4)
  %y = f32[32,64]{1,0} parameter(5)
  %all-gather-start = (f32[64]{0}, f32[512]{0}) all-gather-start(%g), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %gemm = f32[8,4]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm_body
  %sum = f32[8,4]{1,0} fusion(%gemm), kind=kLoop, calls=%add_body
  %all-gather-done = f32[512]{0} all-gather-done(%all-gather-start)
  %all-reduce-start = f32[64]{0} all-reduce-start(%g), replica_groups={}, backend_config={"collective_backend_config":{"is_sync":true}}
  %all-reduce-done = f32[64]{0} all-reduce-done(%all-reduce-start)
  %scores = f32[2,64,64]{2,1,0} fusion(%s), kind=kLoop, calls=%score_body
  %hidden = f32[2,64,64]{2,1,0} add(%s, %s)
  %mm = (f32[64,64]{1,0}, s8[1024]{0}) custom-call(%x, %y), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  ROOT %out = f32[8,4]{1,0} copy(%sum)
}
"""  # noqa: E501 - XLA's own line format


def test_scheduled_hlo_reading():
    program = gpu_program.analyze_program(SCHEDULED, seq_len=64)
    gather, reduce = program.collectives
    assert (gather.kind, gather.sync, gather.gemms_between, gather.fusions_between) == ("all-gather", False, 1, 1)
    assert (reduce.kind, reduce.sync) == ("all-reduce", True)
    assert program.square_buffers == ["scores f32[2,64,64]"]  # `hidden` has the shape but is no attention op
    assert program.expert_gemms == {"dense dot": 1} and program.attention == "xla"
    assert program.fusions == 3 and program.custom_calls == {"__cublas$lt$matmul": 1}
    stats = hlo_stats.analyze(SCHEDULED, 8)
    assert stats.dot_flops == 2 * 8 * 4 * 16 + 2 * 64 * 64 * 32  # the dot and the GEMM library call


def test_gemm_calls_read_the_same_everywhere():
    """One predicate (`hlo_text.gemm_call`) for the planner's FLOPs and the GPU program's kernels."""
    from zaya_jax.planning.hlo_text import parse_computations

    calls = {
        "__cublas$gemm": "dense",
        "__cublas$lt$matmul": "dense",
        "__cublas$lt$groupedMatmul": "grouped",
        "__cudnn$fmhaSoftmax": "",
        "__onednn$matmul": "",
    }
    lines = [
        f'  %c{k} = (f32[64,64]{{1,0}}, s8[8]{{0}}) custom-call(%x, %y), custom_call_target="{t}"'
        for k, t in enumerate(calls)
    ]
    text = "ENTRY %main (x: f32[64,32], y: f32[32,64]) -> f32[64,64] {\n" + "\n".join(lines) + "\n}\n"
    comps, _ = parse_computations(text)
    instrs = [i for i in next(iter(comps.values())) if i.opcode == "custom-call"]
    assert [hlo_text.gemm_call(i) for i in instrs] == list(calls.values())
    assert [hlo_stats.is_gemm_call(i) for i in instrs] == [v == "dense" for v in calls.values()]
    assert [gpu_program.is_gemm(i, comps) for i in instrs] == [bool(v) for v in calls.values()]


def test_pallas_ragged_dots_count_as_grouped_expert_gemms():
    """A kernel library's Pallas ragged dots (tokamax on H100: Mosaic GPU or Triton custom calls) run only the
    routed rows, like hipBLASLt's grouped GEMM; a Pallas kernel outside the expert GEMMs is none."""
    from zaya_jax.planning import gpu_compile

    calls = [
        ("mosaic_gpu_v2", "jit(step)/jvp()/experts/ragged_dot_sm90/mpmd_map"),
        ("__gpu$xla.gpu.triton", "jit(step)/transpose(jvp())/experts/ragged_contracting_dim_dot/pallas_call"),
        ("mosaic_gpu_v2", "jit(step)/attention/flash/mpmd_map"),
    ]
    lines = [
        f'  %k{k} = bf16[64,16]{{1,0}} custom-call(%a, %b), custom_call_target="{t}", metadata={{op_name="{n}"}}'
        for k, (t, n) in enumerate(calls)
    ]
    dot = "  ROOT %d = f32[64,16]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, "
    dot += 'metadata={op_name="jit(step)/experts/dot_general"}'
    text = "ENTRY %main (a: bf16[64,32], b: bf16[32,16]) -> f32[64,16] {\n"
    text += "  %a = bf16[64,32]{1,0} parameter(0)\n  %b = bf16[32,16]{1,0} parameter(1)\n"
    text += "\n".join(lines) + "\n" + dot + "\n}\n"
    program = gpu_program.analyze_program(text, seq_len=64)
    assert program.expert_gemms == {"grouped Pallas call": 2, "dense dot": 1}
    stats = hlo_stats.analyze(text, 1, classify=gpu_compile._expert_tag)
    dense = 2 * 64 * 16 * 32
    assert gpu_compile._expert_executed(stats, program.expert_gemms, routed=3000.0) == dense + 2000.0


def test_the_compile_line_names_the_grouped_gemm_of_a_dropless_step_only():
    from zaya_jax.planning import gpu_compile

    config = load_config("experiments/zaya1.py:tiny")
    with config.unlocked():
        config.model.kernels.update(platform="cuda", grouped_gemm="ragged_dot")
        assert gpu_compile._grouped_gemm(config) == "ragged_dot"  # `auto` dispatch without an expert axis: dropless
        config.mesh.expert = 4
        assert gpu_compile._grouped_gemm(config) == ""  # `auto` with an expert axis: ep, capacity buffers
        config.mesh.expert, config.model.dispatch = 1, "capacity"
        assert gpu_compile._grouped_gemm(config) == ""
        config.mesh.expert, config.model.dispatch = 4, "ep_ragged"  # grouped GEMMs over the rows received
        assert gpu_compile._grouped_gemm(config) == "ragged_dot"


def _gpu_check(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "launch.gpu_check", *args], cwd=REPO, env=ENV, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def test_gpu_check_refuses_a_file_as_out_before_any_work(tmp_path):
    existing = tmp_path / "report.md"
    existing.write_text("keep me")
    proc = _gpu_check(f"--out={existing}", "--smoke")  # before the smoke run's 90 s of work
    assert proc.returncode == 78 and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
    assert "is an existing file" in proc.stderr and existing.read_text() == "keep me"


def test_full_gpu_check_refuses_a_host_without_a_gpu(tmp_path):
    out = tmp_path / "new" / "report"
    proc = _gpu_check(f"--out={out}")
    assert proc.returncode == 78 and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
    assert "no GPU on this host" in proc.stderr
    assert not (tmp_path / "new").exists()  # a refused command leaves the folders as they were


def test_compile_usage_errors(tmp_path):
    proc = _gpu_check("--compile=a100", f"--out={tmp_path / 'r'}")
    assert proc.returncode == 78 and "choose from h100" in proc.stderr and not (tmp_path / "r").exists()
    proc = _gpu_check("--compile=h100", "--xla_flags=--xla_gpu_a=1,2 xla_b=3", f"--out={tmp_path / 'r'}")
    assert proc.returncode == 78 and "--xla_flags: 'xla_b=3' is not an XLA flag" in proc.stderr, proc.stderr[-2000:]
    if gpu_target.missing_extra("cuda"):
        proc = _gpu_check("--compile=h100")
        assert proc.returncode == 78 and "gpu-compile" in proc.stderr, proc.stderr[-2000:]


def _plan(*args):
    return subprocess.run(
        [sys.executable, "-m", "launch.plan", "--config=experiments/zaya1_tiny.py", *args],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_plan_target_usage_errors():
    """Each refused at once (one line, exit 78), before the minutes of planning."""
    proc = _plan("--target=a100")
    assert proc.returncode == 78 and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
    assert "--target: unknown GPU target 'a100'" in proc.stderr
    proc = _plan("--target=h100", "--hardware=mi300x")
    assert proc.returncode == 78 and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
    assert "--hardware=mi300x and --target=h100 (h100) name different devices" in proc.stderr
    if gpu_target.missing_extra("cuda") is None:
        proc = _plan("--target=h100", "--mesh=data:12", "--cpu_devices=12")
        assert proc.returncode == 78 and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
        assert "12 devices do not fill nodes of --gpus_per_node=8" in proc.stderr and "VERDICT" not in proc.stdout


def test_topology_devices_refuses_a_process_that_may_start_a_gpu_backend():
    """Without JAX_PLATFORMS=cpu, jax.devices() would start a real GPU's backend: one line, before any jax work."""
    code = (
        "from zaya_jax.config import ConfigError\n"
        "from zaya_jax.planning import gpu_target\n"
        "try:\n    gpu_target.topology_devices(gpu_target.get_target('h100'))\n"
        "except ConfigError as err:\n    print(err)\n"
        "import sys; print('backends:', 'jax._src.xla_bridge' in sys.modules and "
        "bool(sys.modules['jax._src.xla_bridge']._backends))"
    )
    env = {k: v for k, v in ENV.items() if k != "JAX_PLATFORMS"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("compiling for h100 needs a process with JAX_PLATFORMS=cpu (here: unset)"), proc
    assert lines[1] == "backends: False"


def test_standin_tools_fail_in_one_line():
    from zaya_jax.planning import rocm_standins

    with pytest.raises(rocm_standins.StandinError, match=r"`ls /nonexistent_zaya \.\.\.` failed .*No such file"):
        rocm_standins._run("ls", "/nonexistent_zaya")


def test_launchers_drop_the_gpu_plugins_noise_on_a_host_without_that_gpu(monkeypatch):
    """With the extra on a CPU host the CUDA plugin's initialize() fails (cuInit 303) and the ROCm plugin finds no
    AMD GPU: jax logs both with a traceback; the launchers' filter drops them only when that GPU is absent."""
    import logging

    from jax._src import hardware_utils

    from launch.cli import _NoTpuProbe

    def record(plugin: str, error: Exception) -> logging.LogRecord:
        msg = "Jax plugin configuration error: Exception when calling %s.initialize()"
        return logging.LogRecord("jax._src.xla_bridge", logging.ERROR, "x", 1, msg, (plugin,), (None, error, None))

    cuda = record("jax_plugins.xla_cuda12", RuntimeError("operation cuInit(0) failed: Unknown CUDA error 303"))
    rocm = record("jax_plugins.xla_rocm7", RuntimeError("No AMD GPUs were found"))
    probe = _NoTpuProbe()
    monkeypatch.setattr(hardware_utils, "has_visible_nvidia_gpu", lambda: False)
    assert not probe.filter(cuda) and not probe.filter(rocm)
    monkeypatch.setattr(hardware_utils, "has_visible_nvidia_gpu", lambda: True)
    assert probe.filter(cuda)  # on an NVIDIA host the failure is real: it is shown
    assert probe.filter(record("jax_plugins.xla_rocm7", RuntimeError("hipErrorNoBinaryForGpu")))


# ------------------------------------------------------------------- the real GPU compiler (the extra)
def _needs_extra(platform: str):
    reason = gpu_target.missing_extra(platform)
    if reason:
        pytest.skip(reason)


def _compile(variant: str, mesh: dict, target: str, hlo_dir, extra_flags: tuple[str, ...] = ()) -> dict:
    """Compile through `launch.gpu_compile_job.run_in_child` (as the CLIs do): an abort in XLA's GPU compiler ends
    a child, never the test worker, and the ROCm stand-ins / plugins load only there."""
    from launch.gpu_compile_job import run_in_child

    config = load_config(f"experiments/zaya1.py:{variant}")
    n = mesh.get("data", 1) * mesh.get("expert", 1)
    cfg, _ = planning_config(
        config, mesh=mesh, batch_per_device=gpu_target.batch_per_shard(config, mesh, n), dispatch=None, num_devices=n
    )
    result = run_in_child(cfg, gpu_target.get_target(target), 1, n, str(hlo_dir), extra_flags)
    assert result["ok"], result["error"]
    assert result["fits"], result["line"]
    assert re.match(rf"compiled for {target}: ok \(peak [\d.]+ GB of [\d.]+ GB; expert FLOPs", result["line"])
    assert os.listdir(hlo_dir) == [f"{target}.hlo.txt"]  # the scheduled HLO, and no spec / result files left
    assert "ENTRY" in (hlo_dir / f"{target}.hlo.txt").read_text()
    return result


@pytest.mark.gpu_compile
@pytest.mark.parametrize("target", ["h100", "mi300x"])
def test_tiny_zero1_expert_parallel_on_8_gpus(target, tmp_path):
    _needs_extra(gpu_target.get_target(target).platform)
    extra = ("--xla_gpu_enable_latency_hiding_scheduler=true",)  # an extra flag reaches the compile and the result
    result = _compile("tiny", {"data": 2, "expert": 4}, target, tmp_path, extra)
    assert result["flags"][-1] == extra[0] and len(result["flags"]) > 1
    kinds = {c["kind"] for c in result["program"]["collectives"]}
    assert {"reduce-scatter", "all-gather", "all-to-all"} <= kinds  # ZeRO-1 and the expert dispatch
    assert result["program"]["expert_gemms"] and result["expert_flops_executed"] > 0


@pytest.mark.gpu_compile
@pytest.mark.parametrize("target", ["h100", "mi300x"])
def test_ep_ragged_exchanges_with_a_ragged_all_to_all(target, tmp_path):
    """`ep_ragged` on data:2 × expert:4 (bf16): the GPU compiler emits ragged all-to-alls (there and back, forward
    and backward), not XLA:CPU's padded stand-in, and grouped expert GEMMs over the rows received."""
    _needs_extra(gpu_target.get_target(target).platform)
    variant = "tiny,model.dtype=bfloat16,model.dispatch=ep_ragged,model.capacity_factor=1.5"
    result = _compile(variant, {"data": 2, "expert": 4}, target, tmp_path)
    kinds = [c["kind"] for c in result["program"]["collectives"]]
    assert kinds.count("ragged-all-to-all") >= 4, kinds  # in the layer loops: (there, back) × (forward, backward)
    assert "grouped GEMM call" in result["program"]["expert_gemms"] or _tokamax_for_gpu(), result["program"]
    assert 1.0 <= result["expert_ratio"] <= 1.15


@pytest.mark.gpu_compile
@pytest.mark.parametrize("target", ["h100", "mi300x"])
def test_zero1_chunk_reduce_scatter_overlaps_the_backward(target, tmp_path):
    """`train.overlap_collectives` on data:8 (the tiny model, remat=full: 2 chunks of 1 layer): chunk 1's gradient
    reduce-scatter is async with the GEMMs of chunk 0's backward between its start and done, on both GPUs."""
    _needs_extra(gpu_target.get_target(target).platform)
    variant = "tiny,model.remat=full,train.overlap_collectives=True"
    result = _compile(variant, {"data": 8}, target, tmp_path)
    scatters = [c for c in result["program"]["collectives"] if c["kind"] == "reduce-scatter"]
    assert len(scatters) >= 2 and max(c["gemms_between"] for c in scatters if not c["sync"]) >= 1, scatters


@pytest.mark.gpu_compile
@pytest.mark.parametrize("target", ["h100", "mi300x"])
def test_pipelined_update_gathers_beside_newton_schulz(target, tmp_path):
    """The pipelined ZeRO-1 update (the default) on data:8, the tiny model with 4 layers (2 layer chunks): no
    gradient reduce-scatter is synchronous, the chunks' all-gathers stay apart (XLA's combiner would merge
    them), and a Newton–Schulz loop runs beside an async collective, on both GPUs. (At this size the scheduler
    may put a small all-reduce there; ZAYA1-base's report in benchmarks/plan_overlap/pipelined_update/ has the
    chunk all-gathers beside it.)"""
    _needs_extra(gpu_target.get_target(target).platform)
    result = _compile("tiny,model.num_layers=4", {"data": 8}, target, tmp_path)
    collectives = result["program"]["collectives"]
    assert not [c for c in collectives if c["kind"] == "reduce-scatter" and c["sync"]], collectives
    assert sum(c["kind"] == "all-gather" for c in collectives) >= 2, collectives
    assert any(c["loops_between"] and c["gemms_between"] for c in collectives if not c["sync"]), collectives


@pytest.mark.gpu_compile
@pytest.mark.parametrize("target, attention", [("h100", "cudnn"), ("mi300x", "pallas")])
def test_tiny_bf16_on_one_gpu(target, attention, tmp_path):
    """The kernels `auto` picks for each GPU, as its compiler emits them: attention (cuDNN's fused kernel on H100,
    Pallas's Triton flash attention on MI300X, neither with an [.., S, S] buffer) and the dropless expert GEMMs:
    hipBLASLt's grouped GEMM on MI300X (`ragged_dot_bf16`, forward and backward: 2 + 4 calls, the routed FLOPs
    only); on H100 tokamax's Mosaic GPU grouped kernels where tokamax >= 0.0.17 is installed (the `gpu-compile`
    extra asks for it), else XLA's `ragged_dot`, dense GEMMs over all 4 experts (docs/kernels.md, "what the GPU
    compiler makes of it")."""
    _needs_extra(gpu_target.get_target(target).platform)
    result = _compile("tiny,model.dtype=bfloat16", {"data": 1}, target, tmp_path)
    program = result["program"]
    assert program["attention"] == attention and result["memory"]["argument"] > 0
    assert program["square_buffers"] == []  # the fused kernels keep no [.., S, S] scores
    if target == "mi300x":
        assert program["expert_gemms"] == {"grouped GEMM call": 6}, program["expert_gemms"]
        assert 1.0 <= result["expert_ratio"] <= 1.15
    elif _tokamax_for_gpu():
        assert result["kernels"].startswith("platform=cuda matmul=xla grouped_gemm=tokamax"), result["kernels"]
        assert "(tokamax)" in result["line"]
        # Mosaic GPU calls in the scheduled HLO: 4 forward and 4 input-gradient `ragged_dot_sm90`, 4 weight-gradient
        # `ragged_contracting_dim_dot_sm90` (tokamax 0.0.17, jax 0.12.0.1)
        assert program["expert_gemms"] == {"grouped Pallas call": 12}, program["expert_gemms"]
        assert program["custom_calls"].get("mosaic_gpu_v2") == 12, program["custom_calls"]
        assert 1.0 <= result["expert_ratio"] <= 1.15
    else:
        assert "grouped_gemm=ragged_dot (grouped_gemm auto: tokamax" in result["kernels"]
        assert "grouped GEMM call" not in program["expert_gemms"] and result["expert_ratio"] > 3.5


@pytest.mark.parametrize(
    "calls, attention",
    [
        ([("__gpu$xla.gpu.triton", "jit(step)/jvp(attention)/jvp(jit(mha))/mha_forward/pallas_call")], "pallas"),
        ([("__gpu$xla.gpu.triton", "jit(step)/experts/ragged_contracting_dim_dot/pallas_call")], "xla"),
        ([("__cudnn$fmhaSoftmax", "jit(step)/attention/dot_product_attention")], "cudnn"),
    ],
)
def test_attention_kernel_is_read_from_its_custom_calls(calls, attention):
    """Pallas's flash attention is a Triton call named `mha_forward`; another Triton call (a Pallas ragged dot)
    is not attention; cuDNN's is `__cudnn$fmha…`."""
    lines = [
        f'  %k{k} = bf16[64,16]{{1,0}} custom-call(%a, %b), custom_call_target="{t}", metadata={{op_name="{n}"}}'
        for k, (t, n) in enumerate(calls)
    ]
    text = "ENTRY %main (a: bf16[64,32], b: bf16[32,16]) -> bf16[64,16] {\n"
    text += "  %a = bf16[64,32]{1,0} parameter(0)\n  %b = bf16[32,16]{1,0} parameter(1)\n" + "\n".join(lines) + "\n}\n"
    assert gpu_program.analyze_program(text, seq_len=64).attention == attention


def _tokamax_for_gpu() -> bool:
    """tokamax >= 0.0.17 (with jax 0.12: the `gpu-compile` extra) is installed."""
    try:
        version = importlib.metadata.version("tokamax")
    except importlib.metadata.PackageNotFoundError:
        return False
    return tuple(int(p) for p in version.split(".")[:3]) >= (0, 0, 17)
