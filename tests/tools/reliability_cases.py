"""The adversarial set shared by `tests/integration/test_reliability.py` (the `ci` cases) and
`tests/tools/adversarial.py` (all): bad inputs that must end in one clear line and exit status 78, and the
accounting of committed steps lost per injected fault from a run's event log.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from typing import Callable

from launch.cli import EXIT_BAD_INPUT
from tests.tools.checkpoint_helpers import REPO, config_overrides, env_for

# absl / std-logging lines a launcher may print before its error (not part of the error report)
_LOG_LINE = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d|WARNING:|INFO:)")


def error_problem(
    proc: subprocess.CompletedProcess, prog: str, rc: int = EXIT_BAD_INPUT, expect: str = ""
) -> str | None:
    """None if `proc` failed with exit status `rc` and exactly one line `PROG: error: ...` (containing `expect`),
    printed last and on a line of its own, and no traceback; else what is wrong."""
    err = proc.stderr
    lines = [line for line in err.splitlines() if line.strip() and not _LOG_LINE.match(line)]
    if proc.returncode != rc:
        return f"exit status {proc.returncode}, expected {rc}: {err.strip()[-300:]!r}"
    if "Traceback" in err:
        return f"traceback: {err.strip()[-300:]!r}"
    errors = [line for line in lines if f"{prog}: error:" in line]
    if len(errors) != 1 or not lines[-1].startswith(f"{prog}: error: "):
        return f"not one error line at the end: {lines[-3:]!r}"
    if expect not in lines[-1]:
        return f"the error is not the expected one ({expect!r}): {lines[-1]!r}"
    return None


@dataclasses.dataclass
class Context:
    """Files the bad inputs point at (made by `make_context`)."""

    root: str
    file: str  # an existing regular file
    ckpt: str  # a checkpoint directory of the tiny config (random state, step 2)
    data: str  # a data cache dir holding the small default corpus (seq 32), as `config_overrides` expects
    prepared: str  # that prepared directory


def make_context(root: str) -> Context:
    import jax

    from tests.tools.checkpoint_helpers import random_state, tiny_mesh_config
    from zaya_jax.checkpoint import Checkpointer
    from zaya_jax.data import corpus
    from zaya_jax.parallel.mesh import make_mesh

    os.makedirs(root, exist_ok=True)
    file = os.path.join(root, "a_file")
    with open(file, "w") as f:
        f.write("not a directory\n")
    config = tiny_mesh_config(dict(data=jax.device_count(), expert=1, context=1))
    _, state = random_state(config, make_mesh(config))
    ckpt = os.path.join(root, "ckpt")
    ck = Checkpointer(ckpt, async_save=False)
    ck.save(2, state, {"data": None, "config": config.to_dict()}, wait=True)
    ck.close()
    data = os.path.join(root, "data")
    prepared = corpus.default_corpus_dir(data, 32, "byte", 200_000)
    corpus.prepare_default_corpus(prepared, 32, "byte", 200_000, eval_fraction=0.0, progress=False)
    return Context(root, file, ckpt, data, prepared)


@dataclasses.dataclass(frozen=True)
class BadInput:
    name: str
    prog: str  # launch module and the error prefix
    args: Callable[[Context], list[str]]
    ci: bool = False  # also part of the test suite (the rest: tests/tools/adversarial.py)
    setup: Callable[[Context, str], Callable[[], None]] | None = None  # (ctx, workdir) -> cleanup
    env: tuple[tuple[str, str], ...] = ()
    devices: int | None = 8  # emulated CPU devices in the environment (None: as the launcher decides)
    expect: str = ""  # a part of the error line that shows the right check caught it


def _w(ctx: Context, name: str) -> str:
    return os.path.join(ctx.root, "work", name)


def _write(ctx: Context, name: str, text: str | bytes) -> str:
    path = os.path.join(ctx.root, "inputs", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
    return path


def _train(
    name: str, *extra: str | Callable[[Context], str], ci: bool = False, base: bool = True, workdir: bool = True, **kw
) -> BadInput:
    def args(ctx: Context) -> list[str]:
        rest = [e(ctx) if callable(e) else e for e in extra]
        # the tests' small config first (a case that wrongly trains finishes fast), the case's flags last
        head = config_overrides(ctx.data) if base else []
        if workdir and not any(r.startswith("--workdir") for r in rest):
            head.append(f"--workdir={_w(ctx, name)}")
        return head + rest

    return BadInput(name, "train", args, ci, **kw)


def _hold_lock(ctx: Context, workdir: str) -> Callable[[], None]:
    from zaya_jax.checkpoint.lock import DirLock

    lock = DirLock({"workdir": workdir}, "train")
    lock.acquire()
    return lock.release


def _copy_ckpt(ctx: Context, workdir: str) -> Callable[[], None]:
    import shutil

    shutil.copytree(ctx.ckpt, os.path.join(workdir, "checkpoints"))
    return lambda: None


def _bpe_at(ctx: Context, name: str, vocab_size: int) -> Callable[[], None]:
    from zaya_jax.data.bpe import train_bpe

    train_bpe([_write(ctx, "bpe.txt", "hello world, hello tokens\n" * 50)], vocab_size, _w(ctx, name))
    return lambda: None


def _truncated_hf(ctx: Context, workdir: str) -> Callable[[], None]:
    """An HF directory (`_w(ctx, "hf_truncated")`) exported from the tiny checkpoint, its safetensors cut in half."""
    from zaya_jax import hf
    from zaya_jax.checkpoint import load_model

    out = _w(ctx, "hf_truncated")
    if not os.path.isdir(out):
        hf.save_pretrained(load_model(ctx.ckpt)[1], out)
        weights = os.path.join(out, "model.safetensors")
        with open(weights, "r+b") as f:
            f.truncate(os.path.getsize(weights) // 2)
    return lambda: None


BAD_INPUTS: list[BadInput] = [
    # ---- launch.train: config file and fields
    _train("missing_config_file", "--config=nope/missing.py", base=False, ci=True, expect="does not exist"),
    _train("config_syntax_error", lambda c: "--config=" + _write(c, "syntax.py", "def get_config(:\n"), base=False),
    _train("config_without_get_config", lambda c: "--config=" + _write(c, "empty.py", "X = 1\n"), base=False),
    _train("unknown_field", "--config.model.foo=1", ci=True, expect="no field 'foo'"),
    _train("misspelt_field", "--config.train.stepz=10", ci=True, expect="did you mean 'steps'"),
    _train("field_of_wrong_type", "--config.train.steps=abc"),
    _train("negative_steps", "--config.train.steps=-5", ci=True, expect="train.steps=-5"),
    _train("zero_batch", "--config.train.global_batch_size=0"),
    _train("sequence_longer_than_positions", "--config.train.seq_len=4096"),
    _train("negative_eval_every", "--config.train.eval_every=-1"),
    _train("unknown_dispatch", "--config.model.dispatch=bogus"),
    _train("negative_learning_rate", "--config.optimizer.learning_rate=-1", ci=True, expect="learning_rate=-1"),
    _train("nan_learning_rate", "--config.optimizer.learning_rate=nan", ci=True, expect="learning_rate=nan must"),
    _train("inf_adam_learning_rate", "--config.optimizer.adam_learning_rate=inf", ci=True, expect="=inf must"),
    _train("keep_zero_checkpoints", "--config.checkpoint.keep=0"),
    _train("bad_fault_spec", "--config.checkpoint.faults=explode@3"),
    _train("missing_config_flag", base=False),
    _train("missing_workdir_flag", workdir=False),
    _train("empty_workdir", "--workdir="),
    _train("unknown_flag", "--nonsense=1"),
    _train("cpu_devices_not_a_number", "--cpu_devices=abc", devices=None),
    _train("profile_steps_not_numbers", "--profile_steps=a,b"),
    # ---- layout
    _train("batch_not_divisible_by_mesh", "--config.train.global_batch_size=7", ci=True, expect="batch 7 is not"),
    _train("devices_do_not_divide_batch", "--cpu_devices=3", ci=True, devices=None, expect="size 3"),
    _train("ramp_stage_not_divisible", "--config.train.batch_ramp=((2, 12),)"),
    _train("microbatches_do_not_divide_batch", "--config.train.microbatches=3"),
    _train("expert_axis_does_not_divide_experts", "--config.mesh.expert=3"),
    _train("mesh_larger_than_devices", "--config.mesh.data=16"),
    _train("two_fill_axes", "--config.mesh.expert=-1"),
    _train(
        "sequence_does_not_split_over_context",
        "--config.mesh.context=2",
        "--config.mesh.data=4",
        "--config.train.seq_len=33",
    ),
    _train("available_devices_not_a_number", env=(("ZAYA_AVAILABLE_DEVICES", "four"),)),
    # ---- directories, data, checkpoints
    _train("workdir_is_a_file", lambda c: f"--workdir={c.file}", ci=True, expect="is not a directory"),
    _train("workdir_in_use", ci=True, setup=_hold_lock, expect="is in use by train (pid"),
    _train("data_source_missing", "--config.data.sources=('/nonexistent/prepared',)"),
    _train("checkpoint_of_another_model", "--config.model.hidden_size=32", setup=_copy_ckpt),
    # ---- launch.prepare_data
    BadInput(
        "output_is_a_file",
        "prepare_data",
        lambda c: ["--input=" + _write(c, "ok.txt", "hello world\n"), f"--output={c.file}", "--seq_len=32"],
        ci=True,
        expect="is not a directory",
    ),
    BadInput("input_missing", "prepare_data", lambda c: ["--input=/nonexistent/*.txt", f"--output={_w(c, 'p1')}"]),
    BadInput(
        "input_blank",
        "prepare_data",
        lambda c: ["--input=" + _write(c, "blank.txt", "   \n"), f"--output={_w(c, 'p2')}", "--seq_len=32"],
    ),
    BadInput(
        "jsonl_bad_line",
        "prepare_data",
        lambda c: [
            "--input=" + _write(c, "bad.jsonl", '{"text": "a"}\n{oops\n'),
            f"--output={_w(c, 'p3')}",
            "--seq_len=32",
        ],
    ),
    BadInput(
        "jsonl_missing_field",
        "prepare_data",
        lambda c: [
            "--input=" + _write(c, "nofield.jsonl", '{"body": "a"}\n'),
            f"--output={_w(c, 'p4')}",
            "--seq_len=32",
        ],
    ),
    BadInput(
        "zero_seq_len",
        "prepare_data",
        lambda c: [f"--input={_write(c, 'ok.txt', 'hello world')}", f"--output={_w(c, 'p5')}", "--seq_len=0"],
    ),
    BadInput(
        "tokenizer_missing",
        "prepare_data",
        lambda c: [
            f"--input={_write(c, 'ok.txt', 'hello')}",
            f"--output={_w(c, 'p6')}",
            "--tokenizer=/nonexistent/tokenizer.json",
        ],
    ),
    BadInput(
        "output_holds_other_data",
        "prepare_data",
        lambda c: [f"--input={_write(c, 'ok.txt', 'hello')}", f"--output={os.path.dirname(c.file)}", "--seq_len=32"],
    ),
    # ---- launch.train_tokenizer
    BadInput(
        "tokenizer_vocab_too_small",
        "train_tokenizer",
        lambda c: [f"--input={_write(c, 'ok.txt', 'hello world')}", f"--output={_w(c, 't1')}", "--vocab_size=100"],
        ci=True,
        expect="too small",
    ),
    BadInput(
        "tokenizer_output_holds_another",
        "train_tokenizer",
        lambda c: [f"--input={_write(c, 'ok.txt', 'hello world')}", f"--output={_w(c, 't2')}", "--vocab_size=300"],
        setup=lambda c, w: _bpe_at(c, "t2", 280),
        expect="never overwritten",
    ),
    BadInput(
        "tokenizer_vocab_a_trillion",
        "train_tokenizer",
        lambda c: [
            f"--input={_write(c, 'ok.txt', 'hello world')}",
            f"--output={_w(c, 't4')}",
            "--vocab_size=1000000000000",
        ],
        ci=True,
        expect="--vocab_size=1000000000000",
    ),
    BadInput(
        "tokenizer_output_is_a_file",
        "train_tokenizer",
        lambda c: [f"--input={_write(c, 'ok.txt', 'hello world')}", f"--output={c.file}", "--vocab_size=300"],
        ci=True,
        expect="is an existing file",
    ),
    BadInput(
        "tokenizer_empty_corpus",
        "train_tokenizer",
        lambda c: ["--input=" + _write(c, "blank.txt", "  \n"), f"--output={_w(c, 't5')}", "--vocab_size=300"],
        ci=True,
        expect="no documents",
    ),
    # ---- launch.plan
    BadInput(
        "plan_negative_seq_len",
        "plan",
        lambda c: ["--config=experiments/zaya1_tiny.py", "--seq_len=-1"],
        ci=True,
        expect="--seq_len",
    ),
    BadInput("bench_zero_trials", "bench", lambda c: ["--suite=gemm", "--trials=0"], ci=True, expect="--trials"),
    BadInput(
        "check_sizing_negative_tokens",
        "check_sizing",
        lambda c: ["--config=experiments/zaya1_tiny.py", "--tokens_per_device=-1"],
        expect="--tokens_per_device",
    ),
    # ---- launch.generate
    BadInput(
        "negative_max_new_tokens",
        "generate",
        lambda c: [f"--checkpoint={c.ckpt}", "--prompt=hi", "--max_new_tokens=-3"],
        ci=True,
        expect="--max_new_tokens=-3",
    ),
    BadInput(
        "checkpoint_missing",
        "generate",
        lambda c: ["--checkpoint=/nonexistent/ckpt", "--prompt=hi"],
        ci=True,
        expect="does not exist",
    ),
    BadInput(
        "hf_folder_without_config",
        "generate",
        lambda c: [f"--hf={c.prepared}", "--prompt=hi"],
        ci=True,
        expect="has no config.json",
    ),
    BadInput(
        "hf_config_not_json",
        "generate",
        lambda c: [f"--hf={os.path.dirname(_write(c, 'hf/config.json', '{oops'))}", "--prompt=hi"],
    ),
    BadInput("hf_and_checkpoint", "generate", lambda c: [f"--hf={c.root}", f"--checkpoint={c.ckpt}", "--prompt=x"]),
    BadInput("no_model", "generate", lambda c: ["--prompt=hi"]),
    BadInput(
        "generate_past_the_positions",
        "generate",
        lambda c: [f"--checkpoint={c.ckpt}", "--prompt=hi", "--max_new_tokens=2000"],
        ci=True,
        expect="runs past the model's 1024 positions",
    ),
    BadInput(
        "generate_a_billion_tokens",
        "generate",
        lambda c: [f"--checkpoint={c.ckpt}", "--prompt=hi", "--max_new_tokens=1000000000"],
        ci=True,
        expect="--max_new_tokens=1000000000",
    ),
    BadInput(
        "generate_nan_temperature", "generate", lambda c: [f"--checkpoint={c.ckpt}", "--prompt=a", "--temperature=nan"]
    ),
    BadInput("top_p_zero", "generate", lambda c: [f"--checkpoint={c.ckpt}", "--prompt=hi", "--top_p=0"]),
    BadInput(
        "negative_temperature", "generate", lambda c: [f"--checkpoint={c.ckpt}", "--prompt=a", "--temperature=-1"]
    ),
    BadInput("empty_prompt", "generate", lambda c: [f"--checkpoint={c.ckpt}", "--prompt="]),
    BadInput("missing_prompt", "generate", lambda c: [f"--checkpoint={c.ckpt}"]),
    # ---- launch.eval
    BadInput("nothing_to_evaluate", "eval", lambda c: [f"--checkpoint={c.ckpt}"]),
    BadInput("eval_checkpoint_missing", "eval", lambda c: ["--checkpoint=/nonexistent", f"--data={c.prepared}"]),
    BadInput("data_not_prepared", "eval", lambda c: [f"--checkpoint={c.ckpt}", f"--data={c.root}"]),
    BadInput("mc_file_missing", "eval", lambda c: [f"--checkpoint={c.ckpt}", "--mc=/nonexistent/items.jsonl"]),
    BadInput("zero_eval_batch", "eval", lambda c: [f"--checkpoint={c.ckpt}", f"--data={c.prepared}", "--batch_size=0"]),
    BadInput(
        "eval_truncated_safetensors",
        "eval",
        lambda c: [f"--hf={_w(c, 'hf_truncated')}", f"--data={c.prepared}"],
        ci=True,
        setup=_truncated_hf,
        expect="not a readable safetensors file",
    ),
    # ---- launch.reshard
    BadInput(
        "reshard_mesh_batch_does_not_split",
        "reshard",
        lambda c: [f"--src={c.ckpt}", f"--dst={_w(c, 'r1')}", "--mesh=data:3"],
        ci=True,
        devices=None,
        expect="batch 8 is not divisible by data-parallel size 3",
    ),
    BadInput(
        "reshard_unknown_axis", "reshard", lambda c: [f"--src={c.ckpt}", f"--dst={_w(c, 'r2')}", "--mesh=bogus:2"]
    ),
    BadInput("reshard_dst_not_empty", "reshard", lambda c: [f"--src={c.ckpt}", f"--dst={c.root}"]),
    BadInput("reshard_src_missing", "reshard", lambda c: ["--src=/nonexistent", f"--dst={_w(c, 'r3')}"]),
    BadInput("reshard_from_hf_without_dst", "reshard", lambda c: [f"--from_hf={c.root}"]),
    BadInput("reshard_nothing_to_do", "reshard", lambda c: []),
    BadInput(
        "reshard_from_truncated_safetensors",
        "reshard",
        lambda c: [f"--from_hf={_w(c, 'hf_truncated')}", f"--dst={_w(c, 'r4')}"],
        ci=True,
        setup=_truncated_hf,
        expect="not a readable safetensors file",
    ),
    # ---- launch.supervise
    BadInput("supervise_without_command", "supervise", lambda c: ["--max_restarts=1"], ci=True, expect="after `--`"),
    BadInput("supervise_empty_command", "supervise", lambda c: [f"--workdir={_w(c, 's1')}", "--"]),
    BadInput("supervise_bad_number", "supervise", lambda c: ["--max_restarts=abc", "--", "true"]),
    BadInput(
        "supervise_zero_startup_timeout",
        "supervise",
        lambda c: [f"--workdir={_w(c, 's2')}", "--startup_timeout=0", "--", "true"],
        ci=True,
        expect="--startup_timeout=0.0 must be > 0",
    ),
    BadInput(
        "supervise_nan_heartbeat_timeout",
        "supervise",
        lambda c: [f"--workdir={_w(c, 's3')}", "--heartbeat_timeout=nan", "--", "true"],
        expect="must be a finite number",
    ),
    BadInput(
        "supervise_missing_program",
        "supervise",
        lambda c: [f"--workdir={_w(c, 's4')}", "--", "/nonexistent/cmd"],
        ci=True,
        expect="'/nonexistent/cmd' not found",
    ),
]


def run_bad_input(case: BadInput, ctx: Context, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `case` (with its setup / cleanup) on 8 emulated devices."""
    argv = case.args(ctx)
    workdir = next((a.split("=", 1)[1] for a in argv if a.startswith("--workdir=")), _w(ctx, case.name))
    cleanup = case.setup(ctx, workdir) if case.setup else None
    try:
        return subprocess.run(
            [sys.executable, "-m", f"launch.{case.prog}", *argv],
            cwd=REPO,
            env=env_for(case.devices, **dict(case.env)),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        if cleanup:
            cleanup()


# ------------------------------------------------------------------------------------ damaged checkpoints
def _damage(path: str, mode: str) -> None:
    if mode == "delete":
        os.remove(path)
        return
    with open(path, "r+b") as f:
        if mode == "truncate":
            f.truncate(os.path.getsize(path) // 2)
            return
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))


def damaged_file_sweep(root: str, modes: tuple[str, ...]) -> list[dict]:
    """Save steps 2 and 4 of random tiny states; then, for every file of step 4 and every mode in `modes`
    (delete / truncate / bitflip), damage a fresh copy and restore it the way a restarted trainer does.

    Returns per case {"file", "mode", "restored" (step), "console" (the fallback line), "problem"}: `problem`
    is None when the restore returned step 4 or step 2 bit-identical and a fallback quarantined step 4 and
    said so on the console; otherwise it says what went wrong (a wrong state, an exception).
    """
    import logging
    import shutil

    import jax
    import numpy as np

    from tests.tools.checkpoint_helpers import random_state, tiny_mesh_config
    from zaya_jax.checkpoint import make_checkpointer
    from zaya_jax.checkpoint.events import read_events
    from zaya_jax.parallel.mesh import make_mesh

    config = tiny_mesh_config(dict(data=8, expert=1, context=1))
    with config.unlocked():
        config.checkpoint.async_save = False
    mesh = make_mesh(config)
    hosts, states = zip(*(random_state(config, mesh, seed=s) for s in (2, 4)))
    shardings = jax.tree.map(lambda x: x.sharding, states[0])
    pristine = os.path.join(root, "pristine")
    ck = make_checkpointer(config, pristine, handle_signals=False)
    ck._shardings = shardings
    for step, state in zip((2, 4), states):
        ck.save_now(step, state)
    ck.finish(4, states[1])
    step_dir = os.path.join(pristine, "checkpoints", "4")
    files = sorted(os.path.relpath(os.path.join(r, f), step_dir) for r, _, fs in os.walk(step_dir) for f in fs)
    console: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: console.append(record.getMessage())
    logger = logging.getLogger("zaya_jax.checkpoint.trainer")
    logger.addHandler(handler)
    out = []
    try:
        for rel in files:
            for mode in modes:
                if mode != "delete" and os.path.getsize(os.path.join(step_dir, rel)) == 0:
                    continue
                case = {"file": rel, "mode": mode, "restored": None, "console": None, "problem": None}
                out.append(case)
                workdir = os.path.join(root, "case")
                shutil.rmtree(workdir, ignore_errors=True)
                shutil.copytree(pristine, workdir)
                _damage(os.path.join(workdir, "checkpoints", "4", rel), mode)
                console.clear()
                ck = make_checkpointer(config, workdir, handle_signals=False)
                try:
                    restored = ck.restore_or_keep(states[0], shardings)
                except Exception as err:  # noqa: BLE001 - reported as the case's problem
                    case["problem"] = f"{type(err).__name__}: {err}"
                    continue
                finally:
                    ck.lock.release()
                rows = read_events(os.path.join(workdir, "events.jsonl"))
                step = case["restored"] = next(r["step"] for r in rows if r["event"] == "restored")
                case["console"] = next((m for m in console if "falling back" in m), None)
                want = hosts[(2, 4).index(step)]
                if not all(
                    np.array_equal(np.asarray(a), b) for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(want))
                ):
                    case["problem"] = f"restored step {step} differs from what was saved"
                elif step == 2 and (
                    case["console"] is None
                    or os.path.exists(os.path.join(workdir, "checkpoints", "4"))
                    or not os.path.isdir(os.path.join(workdir, "checkpoints.corrupt"))
                ):
                    case["problem"] = "fell back without quarantining step 4 and saying so"
    finally:
        logger.removeHandler(handler)
    return out


# ---------------------------------------------------------------------------------------------- faults
def fault_outcomes(rows: list[dict]) -> list[dict]:
    """For every injected fault in a supervised run's event log: the newest intact committed step when it hit
    (`good`; None if there was none), the step training resumed from (`resumed`; None if it did not), and
    `lost` = good − resumed.

    A step an injected corruption damaged is not intact until it is committed again. Process faults (crash,
    kill, hang, preemption, device loss, corruption) resume in the supervisor's next attempt; NaN / spike
    faults roll back in place.
    """
    by_attempt: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("attempt_id"):
            by_attempt.setdefault(row["attempt_id"], []).append(row)
    attempts = [r["attempt_id"] for r in rows if r.get("event") == "child_start"]
    damaged: set[int] = set()
    out = []
    for i, attempt in enumerate(attempts):
        mine = by_attempt.get(attempt, [])
        for row in mine:  # the damage as it stands when this attempt ends
            if row.get("event") == "commit":
                damaged.discard(int(row["step"]))
            elif row.get("event") == "fault" and row["kind"] == "corrupt_checkpoint":
                damaged.add(int(row["step"]))
        exit_row = next((r for r in mine if r.get("event") == "child_exit"), {})
        nxt = by_attempt.get(attempts[i + 1], []) if i + 1 < len(attempts) else []
        start = next((r for r in nxt if r.get("event") in ("restored", "fresh_start")), None)
        for k, row in enumerate(mine):
            if row.get("event") != "fault":
                continue
            if row["kind"] in ("nan", "spike"):
                j = next((j for j in range(k, len(mine)) if mine[j].get("event") == "rollback"), len(mine))
                before = [int(r["step"]) for r in mine[:j] if r.get("event") in ("commit", "restored")]
                good = max(before) if before else None
                resumed = mine[j]["to_step"] if j < len(mine) else None
            else:
                intact = [s for s in exit_row.get("committed", []) if s not in damaged]
                good = max(intact) if intact else None
                resumed = int(start["step"]) if start else None
            lost = None if good is None or resumed is None else good - resumed
            out.append({"fault": row["fault"], "kind": row["kind"], "good": good, "resumed": resumed, "lost": lost})
    return out


def summary_of(rows: list[dict]) -> dict:
    return next((r for r in reversed(rows) if r.get("event") == "summary"), {})


def dump(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, default=str)
