"""Compile for an AMD GPU on a host without one: stand-ins for the ROCm runtime libraries (docs/planner.md,
"Compiling for a GPU without one").

The ROCm PJRT plugin (`jax-rocm7-plugin`) holds XLA's ROCm compiler, but its shared library links against about a
dozen ROCm *runtime* libraries (HIP, HSA, hipBLASLt, rocBLAS, RCCL, MIOpen, rocprofiler-sdk, amd_smi, ...) that are
not on PyPI, and its `initialize()` refuses to register the plugin when no AMD GPU is visible. Compiling needs
none of those libraries' code: only the dynamic linker needs them to exist. So, on a host with no AMD GPU and no
ROCm install, this module

1. builds (once, with `gcc`, into `~/.cache/zaya_jax/rocm_standins/<plugin digest>/`) one shared object per
   missing library, with the library's soname and the symbol versions the plugin asks for, whose every function
   returns 1 (an error code: nothing here may pretend a call worked);
   An unversioned symbol that a library the linker does find already defines (libstdc++'s, libc's, ...) gets
   no stand-in;
2. loads them into this process (`ctypes`, RTLD_LOCAL: the linker matches the plugin's needed libraries by
   soname among those loaded, and their symbols serve only the plugin), and registers the plugin with the GPU
   count check bypassed.

It runs only for compile-only work (`zaya_jax.planning.gpu_target.topology_devices`, in a JAX_PLATFORMS=cpu
process) and refuses when an AMD GPU is visible: a process that could run on a real GPU never loads a stand-in.
Only libraries the linker cannot find get one: with the ROCm runtime installed, nothing is built or loaded.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib
import os
import re
import shutil
import subprocess
import tempfile

CACHE = os.path.join("~", ".cache", "zaya_jax", "rocm_standins")
_FORMAT = "2"  # part of the cache key: stand-ins built by an older version of this module are not reused
_SKIP_VERSIONS = re.compile(r"^(GLIBC|GLIBCXX|CXXABI|GCC)_")


class StandinError(RuntimeError):
    """The stand-ins cannot be built or loaded here (message says why)."""


def plugin_library() -> str:
    """Path of the installed ROCm PJRT plugin's shared library (raises StandinError if not installed)."""
    import importlib.util

    for name in ("jax_plugins.xla_rocm7",):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            path = os.path.join(list(spec.submodule_search_locations)[0], "xla_rocm_plugin.so")
            if os.path.exists(path):
                return path
    raise StandinError("the ROCm PJRT plugin is not installed: pip install -e '.[gpu-compile]' (Python >= 3.12)")


def _run(*cmd: str) -> str:
    if shutil.which(cmd[0]) is None:
        raise StandinError(f"`{cmd[0]}` is needed to build the ROCm stand-in libraries; install binutils and gcc")
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as err:
        last = (
            [ln.strip() for ln in (err.stderr or "").splitlines() if ln.strip()] or [f"exit code {err.returncode}"]
        )[-1]
        raise StandinError(f"`{' '.join(cmd[:2])} ...` failed while building the ROCm stand-ins: {last[:300]}") from err


def missing_libraries(plugin: str) -> list[str]:
    """Sonames the plugin needs that the dynamic linker cannot find on this host."""
    return re.findall(r"^\s*(\S+) => not found", _run("ldd", plugin), flags=re.M)


def _found_symbols(plugin: str) -> set[str]:
    """Names of the dynamic symbols defined by the libraries the linker finds for the plugin (libstdc++, libc, ...)."""
    found = re.findall(r"^\s*\S+ => (/\S+)", _run("ldd", plugin), flags=re.M)
    names = set()
    for lib in found:
        for line in _run("readelf", "--dyn-syms", "--wide", lib).splitlines():
            cols = line.split()
            if len(cols) >= 8 and cols[6] != "UND" and cols[4] in ("GLOBAL", "WEAK"):
                names.add(cols[7].split("@", 1)[0])
    return names


def _needed_versions(plugin: str) -> dict[str, str]:
    """Symbol version name → the library file that must define it (the plugin's `.gnu.version_r`)."""
    owner, out = "", {}
    for line in _run("readelf", "-V", "--wide", plugin).splitlines():
        m = re.search(r"File: (\S+)", line)
        if m:
            owner = m.group(1)
        m = re.search(r"Name: (\S+)", line)
        if m and owner:
            out[m.group(1)] = owner
    return out


def _undefined_symbols(plugin: str) -> list[tuple[str, str, str]]:
    """(name, version or '', FUNC|OBJECT|NOTYPE) of every global undefined dynamic symbol of the plugin."""
    out = []
    for line in _run("readelf", "--dyn-syms", "--wide", plugin).splitlines():
        cols = line.split()
        if len(cols) >= 8 and cols[6] == "UND" and cols[4] == "GLOBAL":
            name, _, version = cols[7].partition("@")
            out.append((name, version.lstrip("@"), cols[3]))
    return out


def _sources(plugin: str, missing: list[str]) -> dict[str, tuple[str, str]]:
    """soname → (C source, version script) for every missing library."""
    versions = _needed_versions(plugin)
    defined = _found_symbols(plugin)
    per_lib: dict[str, dict[str, list[tuple[str, str]]]] = {lib: {} for lib in missing}
    for name, version, kind in _undefined_symbols(plugin):
        if version and _SKIP_VERSIONS.match(version):
            continue
        if not version and name in defined:  # e.g. std::filesystem from libstdc++: no stub shadows it
            continue
        # a versioned symbol must come from the library that defines its version; an unversioned one from any
        lib = versions.get(version) if version else missing[0]
        if lib in per_lib:
            per_lib[lib].setdefault(version, []).append((name, kind))
    out = {}
    for lib, by_version in per_lib.items():
        body = ["/* stand-in for " + lib + " (zaya_jax/planning/rocm_standins.py): compile-only, every call fails */"]
        script = []
        for version, symbols in by_version.items():
            for name, kind in symbols:
                body.append(f"char {name}[256];" if kind == "OBJECT" else f"int {name}(void) {{ return 1; }}")
            if version:
                script.append(f"{version} {{ global: {'; '.join(n for n, _ in symbols)}; }};")
        out[lib] = ("\n".join(body) + "\n", "\n".join(script) + "\n")
    return out


def build(plugin: str, cache: str = CACHE) -> list[str]:
    """Build (or reuse) the stand-ins for `plugin`'s missing libraries; returns their paths."""
    missing = missing_libraries(plugin)
    if not missing:
        return []
    with open(plugin, "rb") as f:
        digest = hashlib.sha256(f.read() + _FORMAT.encode()).hexdigest()[:16]
    folder = os.path.join(os.path.expanduser(cache), digest)
    paths = [os.path.join(folder, lib) for lib in missing]
    if all(os.path.exists(p) for p in paths):
        return paths
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        for lib, (source, script) in _sources(plugin, missing).items():
            c, v, so = (os.path.join(tmp, lib + ext) for ext in (".c", ".map", ""))
            with open(c, "w", encoding="utf-8") as f:
                f.write(source)
            with open(v, "w", encoding="utf-8") as f:
                f.write(script)
            flags = [f"-Wl,--version-script={v}"] if script.strip() else []
            _run("gcc", "-shared", "-fPIC", "-w", "-o", so, c, f"-Wl,-soname,{lib}", *flags)
            os.replace(so, os.path.join(folder, lib))  # atomic: a concurrent build never sees half a library
    return paths


def amd_gpus_visible() -> int:
    from jax._src import hardware_utils

    return hardware_utils.num_available_amd_gpus(stop_at=1)


def register_compile_only_plugin() -> None:
    """Register the ROCm plugin in this process for compile-only work (module docstring). Idempotent.
    Raises StandinError when an AMD GPU is visible (use the plugin as installed) or stand-ins cannot be built."""
    import jax._src.xla_bridge as xb

    if "rocm" in xb._backend_factories:  # registered already (by jax on a ROCm host, or by an earlier call)
        return
    if amd_gpus_visible():
        raise StandinError("an AMD GPU is visible: the ROCm plugin registers itself; no stand-ins are loaded")
    plugin = plugin_library()
    for path in build(plugin):
        ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    import jax_plugins.xla_rocm7 as rocm_plugin
    from jax._src import hardware_utils

    real = hardware_utils.num_available_amd_gpus
    hardware_utils.num_available_amd_gpus = lambda stop_at=None: 1  # the plugin's check only; restored below
    try:
        if rocm_plugin.rocm_plugin_extension is None:  # its import failed before the stand-ins were loaded
            with contextlib.suppress(ImportError):
                rocm_plugin.rocm_plugin_extension = importlib.import_module("jax_rocm7_plugin.rocm_plugin_extension")
        rocm_plugin.initialize()
    finally:
        hardware_utils.num_available_amd_gpus = real
