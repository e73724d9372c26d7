"""CUDA's `auto` grouped GEMM follows the installed tokamax (`zaya_jax.kernels.choice.tokamax_unusable`): `tokamax`
from 0.0.17 on (the first whose grouped GEMM compiles for H100 under jax 0.12, docs/kernels.md) when this jax meets
tokamax's own jax requirement, else `ragged_dot`, and the run header says why."""

from __future__ import annotations

import importlib.metadata
import types

import jax
import pytest

from tests.kernels.test_kernels import kernel_cfg
from zaya_jax import kernels
from zaya_jax.kernels import choice

TOKAMAX_17 = ["absl-py>=2.3.0", "jax>=0.11.1", "xprof>=2.23.1", 'jax[cuda13]>=0.11.1; extra == "cuda"']


@pytest.mark.parametrize(
    "version, requires, jax_version, reason",
    [
        ("0.0.17", TOKAMAX_17, "0.12.0.1", ""),
        ("0.0.18", TOKAMAX_17, "0.11.1", ""),
        ("0.0.17", TOKAMAX_17, "0.10.2", "tokamax 0.0.17 needs jax>=0.11.1, this is jax 0.10.2"),
        ("0.0.12", ["jax>=0.9.2"], "0.12.0.1", "tokamax 0.0.12 is older than 0.0.17, the first that compiles"),
        (None, [], "0.12.0.1", "tokamax is not installed: pip install 'tokamax>=0.0.17'"),
    ],
)
def test_tokamax_is_usable_from_0_0_17_with_the_jax_it_asks_for(version, requires, jax_version, reason, monkeypatch):
    def distribution(name):
        assert name == "tokamax"
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return types.SimpleNamespace(version=version, requires=requires)

    monkeypatch.setattr(choice.importlib.metadata, "distribution", distribution)
    monkeypatch.setattr(jax, "__version__", jax_version)
    found = choice.tokamax_unusable.__wrapped__()  # uncached
    assert found.startswith(reason) and bool(found) == bool(reason), found


def test_cuda_auto_follows_the_installed_tokamax():
    """Whichever tokamax this leg installs (the `test` extra: 0.0.12 with jax 0.10 / Python 3.11, 0.0.17 with jax
    0.12), CUDA's `auto` takes it or not by its version, and says so; an explicit choice is never replaced."""
    installed = importlib.metadata.version("tokamax")
    new_enough = tuple(int(p) for p in installed.split(".")[:3]) >= (0, 0, 17)
    m = kernel_cfg("bfloat16", platform="cuda")
    assert kernels.resolve(m).grouped_gemm == ("tokamax" if new_enough else "ragged_dot")
    header = kernels.describe(m)
    assert header.startswith(str(kernels.resolve(m)))
    if new_enough:
        assert header == "platform=cuda matmul=xla grouped_gemm=tokamax attention=cudnn"
    else:
        assert f"(grouped_gemm auto: tokamax {installed} is older than 0.0.17" in header
    assert kernels.resolve(kernel_cfg("bfloat16", platform="cuda", grouped_gemm="ragged_dot")).grouped_gemm == (
        "ragged_dot"
    )
