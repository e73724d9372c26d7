"""Host allocator setting for XLA:CPU: back large malloc blocks with transparent huge pages.

XLA:CPU allocates each execution's temporary buffer (≈ 1.1–1.8 GB for the 100M training step) with
`posix_memalign`; glibc serves blocks that large with a fresh `mmap` and unmaps them on free, so every
step faults the whole buffer in again, 4 KiB at a time: on the 2-core benchmark host ≈ 450k page faults
and ≈ 1.5 CPU-seconds of kernel time per step (`perf`: `clear_page_erms`, `exc_page_fault`). glibc's
tunable `glibc.malloc.hugetlb=1` (glibc ≥ 2.35) asks for transparent huge pages on those mappings: 20×
fewer faults, peak memory unchanged, and the step ≈ 15–20% faster (benchmarks/README.md). Keeping freed
memory instead (`mallopt`: one arena, no mmap, no trim) was tried and rejected: same-size aligned blocks
could not reuse each other, so the heap grew to 1.4–1.9× the peak and was no faster.

Tunables are read when a process starts. `huge_page_env()` gives an environment for child processes
(`default_malloc_env()` one without the tunable, for processes that are not ours, e.g. a benchmark's reference);
`restart_with_huge_pages()` re-executes the running launcher once with it (before jax is imported).
Only for CPU-only hosts: device memory on GPUs has its own allocator. It changes speed, not results;
set $ZAYA_DEFAULT_MALLOC=1 to leave glibc alone.
"""

from __future__ import annotations

import ctypes
import os
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
DISABLE_ENV = "ZAYA_DEFAULT_MALLOC"
MIN_GLIBC = (2, 35)


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the running glibc, or None on another C library."""
    try:
        fn = ctypes.CDLL(None).gnu_get_libc_version
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_char_p
    major, minor = fn().decode().split(".")[:2]
    return int(major), int(minor)


def cpu_only_host(env: dict[str, str] | None = None) -> bool:
    """True when jax will run on the CPU: $JAX_PLATFORMS starts with "cpu", or no ROCm / CUDA device nodes exist."""
    platforms = (os.environ if env is None else env).get("JAX_PLATFORMS", "")
    if platforms:
        return platforms.split(",")[0].strip().lower() == "cpu"
    return not any(os.path.exists(p) for p in ("/dev/kfd", "/dev/nvidiactl"))


def huge_pages_active(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return TUNABLE in env.get("GLIBC_TUNABLES", "").split(":")


def describe() -> str:
    """The malloc setting of this process, for reports."""
    return "malloc: huge pages (glibc.malloc.hugetlb=1)" if huge_pages_active() else "malloc: glibc default"


def wanted(env: dict[str, str] | None = None) -> bool:
    """Whether the tunable should be added: glibc ≥ 2.35, a CPU-only host, not disabled, not already set."""
    env = os.environ if env is None else env
    version = glibc_version()
    return (
        version is not None
        and version >= MIN_GLIBC
        and cpu_only_host(env)
        and env.get(DISABLE_ENV, "0") in ("", "0")
        and not huge_pages_active(env)
    )


def huge_page_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default: os.environ) with the tunable appended to $GLIBC_TUNABLES when `wanted`."""
    env = dict(os.environ if env is None else env)
    if wanted(env):
        env["GLIBC_TUNABLES"] = ":".join(filter(None, (env.get("GLIBC_TUNABLES", ""), TUNABLE)))
    return env


def default_malloc_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default: os.environ) without the tunable and with it disabled, for a child process that
    is not ours: PyTorch's CPU step, for one, is slower and noisier with it (benchmarks/README.md)."""
    env = dict(os.environ if env is None else env)
    rest = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and t != TUNABLE]
    env.pop("GLIBC_TUNABLES", None)
    if rest:
        env["GLIBC_TUNABLES"] = ":".join(rest)
    env[DISABLE_ENV] = "1"
    return env


def restart_with_huge_pages() -> None:
    """Re-execute this Python process (same interpreter and argv) with `huge_page_env()`, if `wanted`.

    Call it from a launcher's `__main__` before jax is imported; never from a library or a notebook
    (it replaces the process). Returns normally when nothing needs to change."""
    if "jax" in sys.modules or not wanted():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], huge_page_env())
