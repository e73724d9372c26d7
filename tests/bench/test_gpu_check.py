"""`launch.gpu_check`: the smoke run writes every section with real numbers; case selection per platform; the
report's verdict; usage errors. The smoke run builds five tiny train steps on XLA:CPU (about 20 CPU-seconds
each: the state-init and step compiles), hence `slow`."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest

from tests.tools import REPO
from zaya_jax import kernels
from zaya_jax.bench import common
from zaya_jax.bench.gpu_check import Options, cases, jobs, parity, report, run, throughput
from zaya_jax.config import load_config

SECTIONS = ("environment", "peaks", "parity", "throughput", "memory")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    failed = run(Options(out_dir=str(out), smoke=True, command="python -m launch.gpu_check --smoke"), log=print)
    rows = common.read_csv(str(out / "report.csv"))
    return failed, rows, (out / "report.md").read_text()


def values(rows, section, case, metric):
    return [r["value"] for r in rows if (r["section"], r["case"], r["metric"]) == (section, case, metric)]


def number(rows, section, case, metric) -> float:
    found = values(rows, section, case, metric)
    assert len(found) == 1, (section, case, metric, found)
    return float(found[0])


@pytest.mark.slow
def test_smoke_report_has_every_section_with_real_numbers(smoke):
    failed, rows, md = smoke
    assert failed == 0, [r for r in rows if r["check"] == "fail"]
    assert rows and set(rows[0]) == set(report.COLUMNS)
    assert {r["section"] for r in rows} == set(SECTIONS)
    for i, section in enumerate(SECTIONS, 1):  # a heading with its wall time, and the wall time as a row
        assert f"## {i}. " in md
        assert number(rows, section, "section", "wall_s") >= 0
    assert "**all checks passed**" in md and "python -m launch.gpu_check --smoke" in md

    assert "platform=cpu" in values(rows, "environment", "kernels", "resolved")[0]
    assert values(rows, "environment", "versions", "jax")[0]
    assert number(rows, "peaks", "gemm bf16 peak", "tflops_best") > 0
    assert number(rows, "peaks", "triad 1 MiB f32", "GBps_best") > 0


@pytest.mark.slow
def test_smoke_parity_numbers(smoke):
    _, rows, _ = smoke
    ref = "cpu float32 (reference)"
    first, last = number(rows, "parity", ref, "loss_first"), number(rows, "parity", ref, "loss_last")
    assert math.isfinite(first) and math.isfinite(last) and last < first  # the same batch each step: it learns
    assert abs(first - math.log(384)) < 0.1  # the tiny config's 384-id vocabulary, freshly initialised
    diff = number(rows, "parity", "cpu bfloat16", "max_abs_diff")
    assert 0 < diff <= parity.TOLERANCE["bfloat16"]  # bf16 GEMM operands differ from fp32, within the bound
    assert abs(number(rows, "parity", "cpu bfloat16", "loss_first") - first) <= diff
    assert [r["check"] for r in rows if r["metric"] == "max_abs_diff"] == ["pass"]


@pytest.mark.slow
def test_smoke_throughput_rows_per_cpu_kernel(smoke):
    _, rows, _ = smoke
    config = load_config("experiments/zaya1_tiny.py")
    tokens = config.train.global_batch_size * config.train.seq_len
    labels = {r["case"] for r in rows if r["section"] == "throughput" and r["case"] != "section"}
    assert labels == {"tiny loops (default)", "tiny ragged_dot", "tiny capacity"}
    for label, kernel in (("tiny loops (default)", "loops"), ("tiny ragged_dot", "ragged_dot")):
        assert f"grouped_gemm={kernel}" in values(rows, "throughput", label, "kernels")[0]
    peak = number(rows, "peaks", "gemm bf16 peak", "tflops_best")
    for label in labels:
        step = number(rows, "throughput", label, "step_s_median")
        assert 0 < number(rows, "throughput", label, "step_s_min") <= step
        assert number(rows, "throughput", label, "tokens_per_s") == pytest.approx(tokens / step, rel=1e-3)
        mfu = number(rows, "throughput", label, "mfu_measured")
        assert mfu == pytest.approx(number(rows, "throughput", label, "model_tflops") / peak, rel=0.02)
        assert math.isnan(number(rows, "throughput", label, "mfu_datasheet"))  # no data sheet for a CPU
        assert number(rows, "throughput", label, "moe_over_dense") > 0
        assert number(rows, "throughput", label, "compile_s") > 0
    assert number(rows, "throughput", "tiny loops (default)", "dropped_fraction") == 0  # dropless


@pytest.mark.slow
def test_smoke_memory_compares_the_same_program(smoke):
    _, rows, _ = smoke
    compiled = number(rows, "memory", "tiny", "compiled_peak")
    assert compiled == number(rows, "throughput", "tiny loops (default)", "compiled_peak")
    # on a CPU host the planner compiles the same XLA:CPU program from abstract shapes: the same peak
    assert number(rows, "memory", "tiny", "compiled_over_planned") == pytest.approx(1.0, abs=0.05)
    assert number(rows, "memory", "tiny", "compile_s") > 0


def _planned(platform: str, monkeypatch, xla_flags: str = "", tokamax: bool = False):
    monkeypatch.setenv("XLA_FLAGS", xla_flags)
    config = cases.ConfigRef("tiny", "tiny", cases.BF16 + (("model.kernels.platform", platform),))
    return {p.label: p for p in throughput.plan_cases([config], platform, tokamax=tokamax)}


@pytest.mark.parametrize("usable", [True, False])
def test_cuda_cases_default_first_and_flag_case_in_a_subprocess(usable, monkeypatch):
    """auto on CUDA: tokamax where the installed one compiles for GPUs, else ragged_dot; cuDNN attention."""
    monkeypatch.setattr(kernels.choice, "tokamax_unusable", lambda: "" if usable else "tokamax 0.0.12 is older")
    planned = _planned("cuda", monkeypatch, "--xla_force_host_platform_device_count=8", tokamax=True)
    ragged, tokamax = "tiny ragged_dot (XLA default lowering)", "tiny tokamax"
    first, second = (tokamax, ragged) if usable else (ragged, tokamax)
    assert list(planned) == [
        f"{first} (default)",
        *([second] if usable else []),
        "tiny ragged_dot (grouped lowering flag)",
        "tiny ragged_dot_bf16",
        *([] if usable else [second]),
        "tiny capacity",
        "tiny attention xla",  # attention cudnn is the default case already
        "tiny attention pallas",
    ]
    assert [p.label for p in planned.values() if p.subprocess] == ["tiny ragged_dot (grouped lowering flag)"]


def test_rocm_flag_in_the_environment_makes_the_grouped_lowering_the_default(monkeypatch):
    flag = cases.GROUPED_LOWERING_FLAG["rocm"]
    planned = _planned("rocm", monkeypatch, f"--xla_foo=1 {flag}=true")
    assert list(planned)[0] == "tiny ragged_dot_bf16 (default)"  # auto on ROCm, with the flag as XLA_FLAGS has it
    assert not planned["tiny ragged_dot_bf16 (default)"].subprocess
    assert not planned["tiny ragged_dot (grouped lowering flag)"].subprocess
    assert planned["tiny ragged_dot (XLA default lowering)"].subprocess  # needs the flag switched off
    assert "tiny attention xla" in planned and "tiny attention pallas" not in planned  # pallas: the default
    assert cases.with_flag(flag, False, f"--xla_foo=1 {flag}=true") == f"--xla_foo=1 {flag}=false"
    assert not cases.flag_state(flag, f"{flag}=true {flag}=false") and cases.flag_state(flag, flag)


def test_defaults_of_every_config_first_then_kernel_by_kernel(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")
    refs = [cases.ConfigRef(n, "tiny", cases.BF16 + (("model.kernels.platform", "rocm"),)) for n in ("a", "b")]
    assert [p.label for p in throughput.plan_cases(refs, "rocm", tokamax=False)] == [
        "a ragged_dot_bf16 (default)",
        "b ragged_dot_bf16 (default)",
        "a ragged_dot (XLA default lowering)",
        "b ragged_dot (XLA default lowering)",
        "a ragged_dot (grouped lowering flag)",
        "b ragged_dot (grouped lowering flag)",
        "a capacity",
        "b capacity",
        "a attention xla",  # pallas attention is ROCm's default
        "b attention xla",
    ]


def test_failed_section_is_a_failed_check_in_the_report(tmp_path):
    def crash(section):
        section.add("case", "value", 1.5, "s")
        raise RuntimeError("device lost\nlong XLA dump")

    section = report.timed("peaks", "2. peaks", crash, log=lambda m: None)
    assert [r["note"] for r in section.failures] == ["RuntimeError: device lost"]
    report.write(str(tmp_path), "t", [section], command="cmd")
    md = (tmp_path / "report.md").read_text()
    assert "**1 failed check(s)**: peaks / section / error" in md and "| case | 1.5 s |" in md
    assert [r["check"] for r in common.read_csv(str(tmp_path / "report.csv"))] == ["", "fail", ""]


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give --out=DIR"),
        (["--lower=tpu"], "unknown platform(s) ['tpu']"),
        (["--out=x", "--configs=huge"], "choose one or more of h1024, 1b"),
    ],
)
def test_usage_errors_exit_78_with_one_line(args, message):
    proc = subprocess.run(
        [sys.executable, "-m", "launch.gpu_check", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 78, proc.stderr[-2000:]
    assert message in proc.stderr and proc.stderr.strip().count("\n") == 0


@pytest.mark.slow
def test_a_case_whose_process_fails_reports_the_error_line():
    """A case in a process of its own (accelerator hosts) with an XLA flag the installed jaxlib does not know:
    the child aborts at start-up and the job's error is XLA's line, not a traceback."""
    planned = throughput.Planned(cases.SMOKE_CONFIG, cases.Case("loops", cases.dropless("loops")), "x", False, True)
    spec = dict(
        config=dataclasses.asdict(planned.config),
        case=dataclasses.asdict(planned.case),
        label="x",
        default=False,
        gemm_peak=1.0,
        sheet_peak=None,
        timing=dataclasses.asdict(throughput.Timing(1, 1, True)),
    )
    command = (sys.executable, "-m", "launch.gpu_check")
    handle = jobs.start("throughput_case", spec, command=command, env={"XLA_FLAGS": "--xla_no_such_flag=1"})
    with pytest.raises(RuntimeError, match=r"job throughput_case exited .*Unknown flag in XLA_FLAGS: --xla_no_such"):
        handle.result()
