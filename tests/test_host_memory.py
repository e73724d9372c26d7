"""Host allocator setting: huge pages for XLA:CPU's large per-step buffers, applied by re-executing launchers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from launch.cpu_devices import running_a_launcher
from tests.tools import REPO as ROOT
from zaya_jax import host_memory

# malloc, touch and free 256 MiB four times from a worker thread (XLA:CPU's temp buffer, simplified);
# print the minor page faults of the last three rounds
PROBE = textwrap.dedent("""
    import ctypes, resource, threading
    libc = ctypes.CDLL(None)
    libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    faults = []
    def rounds():
        for i in range(4):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            block = libc.malloc(256 << 20)
            ctypes.memset(block, 1, 256 << 20)
            libc.free(block)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    t = threading.Thread(target=rounds)
    t.start(); t.join()
    print(sum(faults[1:]))
""")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", host_memory.DISABLE_ENV)}
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


def _faults(env: dict[str, str]) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout)


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "unavailable"


@pytest.mark.skipif(
    (host_memory.glibc_version() or (0, 0)) < host_memory.MIN_GLIBC or _thp_mode() not in ("always", "madvise"),
    reason="needs glibc >= 2.35 and transparent huge pages (always / madvise)",
)
def test_huge_page_tunable_cuts_page_faults_of_large_blocks():
    pages = 3 * (256 << 20) // 4096
    default = _faults(_clean_env())
    tuned_env = host_memory.huge_page_env(_clean_env())
    assert host_memory.huge_pages_active(tuned_env)
    tuned = _faults(tuned_env)
    assert default > 0.5 * pages, f"default glibc should fault every 4 KiB page in again ({default} faults)"
    assert tuned < 0.05 * pages, f"with {host_memory.TUNABLE}: {tuned} faults (default {default})"


def test_env_is_left_alone_when_disabled_or_on_gpu_hosts():
    assert not host_memory.huge_pages_active(host_memory.huge_page_env(_clean_env(ZAYA_DEFAULT_MALLOC="1")))
    assert not host_memory.huge_pages_active(host_memory.huge_page_env(_clean_env(JAX_PLATFORMS="rocm,cpu")))
    once = host_memory.huge_page_env(_clean_env(GLIBC_TUNABLES="glibc.malloc.check=0"))
    if host_memory.huge_pages_active(once):  # glibc >= 2.35: appended once, other tunables kept
        assert once["GLIBC_TUNABLES"] == f"glibc.malloc.check=0:{host_memory.TUNABLE}"
        assert host_memory.huge_page_env(once)["GLIBC_TUNABLES"] == once["GLIBC_TUNABLES"]


def test_default_malloc_env_drops_the_tunable_and_keeps_the_rest():
    """The environment a benchmark gives a process that is not ours (the transformers reference)."""
    env = _clean_env(GLIBC_TUNABLES=f"glibc.malloc.check=0:{host_memory.TUNABLE}")
    plain = host_memory.default_malloc_env(env)
    assert plain["GLIBC_TUNABLES"] == "glibc.malloc.check=0"
    assert plain[host_memory.DISABLE_ENV] == "1"  # a launcher in that process does not add it back
    assert not host_memory.huge_pages_active(host_memory.huge_page_env(plain))
    assert "GLIBC_TUNABLES" not in host_memory.default_malloc_env(_clean_env(GLIBC_TUNABLES=host_memory.TUNABLE))
    assert env["GLIBC_TUNABLES"].endswith(host_memory.TUNABLE), "the caller's environment is not modified"


def test_launcher_restarts_itself_once_with_the_tunable():
    # an inherited XLA_FLAGS device count loses to an explicit --cpu_devices (issue: plan --cpu_devices=64 failed)
    out = subprocess.run(
        [sys.executable, "-m", "launch.host_setup", "--cpu_devices=16"],
        cwd=ROOT,
        env=_clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=8"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    expect = host_memory.huge_pages_active(host_memory.huge_page_env(_clean_env()))
    assert (host_memory.TUNABLE in out) == expect, out
    assert "devices=16 (cpu)" in out, out
    default = subprocess.run(
        [sys.executable, "-m", "launch.host_setup"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=3"),
        check=True,
    ).stdout
    assert "devices=3 (cpu)" in default, default  # the flag's default leaves an inherited count alone
    assert not running_a_launcher(), "pytest is not a launcher"
