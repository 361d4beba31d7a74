"""The CPU stand-in for the CUDA driver, for tests on machines without a GPU (see tests/standin/libcuda.c).

`libcuda.so.1` here is a small C library that cuda-bindings loads like the real driver when its directory is
first on `LD_LIBRARY_PATH` (so only in a subprocess started with `env()`). Its `cuModuleLoadData` receives a
real cubin from NVRTC and cannot run it; instead it loads a host build of the same kernel's CUDA C, found in
`$TGC_STANDIN_DIR` by a hash (FNV-1a 64) of the cubin. `install()` (called by conftest.py when
`TGC_STANDIN_DIR` is set) makes every NVRTC compile of the process also write that host build with g++.

What runs through it is the real path of tgc's CUDA backend: the CUDA C the renderer emits (compiled by NVRTC
to a cubin, and by g++ with tests/standin/kernel.h), the cuda-bindings calls of tgc/backends/cuda.py, their
argument packing, the launch geometry, and the kernel's indexing, barriers and shared memory with one fiber
per GPU thread (kernel.h: a block's threads run on the launching OS thread, each until its next barrier, in
thread order). Not proven: the cubin itself (PTX semantics, ptxas, register or shared memory limits of a real
GPU), warp-level behaviour, memory ordering without barriers (races show only as the fixed order reads them),
real asynchrony, timings.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from session_cache import session_cache_dir

HERE = Path(__file__).parent / "standin"
_SIGNATURE = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s+)?(\w+)\s*\(([^)]*)\)")


def why_unavailable() -> str | None:
    """Why the stand-in cannot be built or used here, or None."""
    if shutil.which("gcc") is None or shutil.which("g++") is None:
        return "the CUDA stand-in needs gcc and g++"
    from tgc.backends.cuda import nvrtc_error
    return nvrtc_error()


def _root() -> Path:
    return Path(tempfile.gettempdir()) / f"tgc-cuda-standin-{os.getuid()}"


def _digest(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


@functools.cache
def driver_dir() -> Path:
    """The directory holding the built `libcuda.so.1` (built once per version of libcuda.c)."""
    src = (HERE / "libcuda.c").read_bytes()
    out = _root() / f"driver-{_digest(src)}"
    lib = out / "libcuda.so.1"
    if not lib.exists():
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".libcuda.{os.getpid()}.so"
        subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(tmp), str(HERE / "libcuda.c"), "-ldl",
                        "-lpthread"], check=True, capture_output=True, text=True)
        os.replace(tmp, lib)
    return out


def kernel_dir() -> Path:
    """Where host builds of kernels go (per version of kernel.h)."""
    out = _root() / f"kernels-{_digest((HERE / 'kernel.h').read_bytes(), Path(__file__).read_bytes())}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def env(base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """An environment for a subprocess that runs CUDA through the stand-in."""
    e = dict(os.environ if base is None else base)
    e["LD_LIBRARY_PATH"] = os.pathsep.join([str(driver_dir()), *filter(None, [e.get("LD_LIBRARY_PATH")])])
    e["TGC_STANDIN_DIR"] = str(kernel_dir())
    if e.get("TGC_TEST_SHARED_DIR") and e.get("TGC_CACHE_DIR") == session_cache_dir(env=e):
        # not the test session's shared cache: a cubin there may have no host build (tests/session_cache.py)
        e["TGC_CACHE_DIR"] = session_cache_dir(standin=True, env=e)
    e.update(extra)
    return e


def run_json(script: str, timeout: float = 600) -> object:
    """Run `script` (dedented) in a subprocess whose CUDA goes through the stand-in (`install()` first, with the
    repo and tests/ importable); it must exit 0 and print JSON as its last stdout line, which is returned."""
    root = Path(__file__).resolve().parents[1]
    e = env()
    e["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "tests")])
    code = "import cuda_standin; cuda_standin.install()\n" + textwrap.dedent(script)
    r = subprocess.run([sys.executable, "-c", code], env=e, cwd=root, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_with_opts(src: str, opts: list, inputs: dict) -> tuple[object, str]:
    """In a stand-in script (`run_json`): run `src` on CUDA with every kernel built with `opts` (`Opt` fields, as
    a BEAM winner stored for it would be; empty: the heuristic's). Returns its first output and its kernels'
    CUDA sources at the inputs' dims."""
    import tgc
    import tgc.api as api
    import tgc.codegen.search as search
    from tgc.codegen.opt import Opt

    orig, cur = search.lookup, [Opt(*o) for o in opts]
    if opts:
        search.lookup = api.lookup = lambda ast, device, width=0: cur
    try:
        prog = tgc.loads(src)
        got = next(iter(prog.run(device="CUDA", **inputs).values()))
        dims: dict[str, int] = {}
        for line in src.splitlines()[:-1]:  # "a: f32[N, K]": the dims of input a
            name, shape = line.split(": ")
            dims.update(zip(shape[shape.index("[") + 1:-1].split(", "), inputs[name].shape))
        return got, "".join(k.src for k in prog.compile("CUDA", dims=dims))
    finally:
        search.lookup = api.lookup = orig


def fnv1a64(data: bytes) -> int:
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def host_source(src: str) -> str:
    """The CUDA C of a kernel made host C++ (with kernel.h), plus `tgc_entry_<name>(void** params)`."""
    from tgc.backends.cstyle import CP_ASYNC_HELPERS, MMA_HELPERS
    from tgc.backends.cuda import HALF_HELPERS
    # kernel.h has host versions of these
    body = src.replace(HALF_HELPERS.strip(), "").replace(MMA_HELPERS, "").replace(CP_ASYNC_HELPERS, "")
    if re.search(r"\basm\s*(volatile\s*)?\(", body):
        raise ValueError("the CUDA stand-in cannot run inline PTX")
    m = _SIGNATURE.search(body)
    if m is None:
        raise ValueError("no __global__ function in the kernel source")
    name, params = m.group(1), [p.strip() for p in m.group(2).split(",") if p.strip()]
    # dynamic shared memory: the stand-in's per-launch buffer (kernel.h)
    body = re.sub(r"extern __shared__ __align__\(\d+\) unsigned char (\w+)\[\];", r"#define \1 tgc_dynamic_smem", body)
    args = []
    for i, p in enumerate(params):
        ctype = re.sub(r"\b__restrict__\b", "", p.rsplit(None, 1)[0]).strip() if " " in p else p
        args.append(f"*({ctype} *)p[{i}]")
    return f'{body}\nextern "C" void tgc_entry_{name}(void **p) {{ {name}({", ".join(args)}); }}\n'


def host_build(src: str, cubin: bytes, out: Path | None = None) -> Path:
    """Compile the host copy of a kernel to `<fnv1a64(cubin)>.so` in the kernel directory (once)."""
    out = out or kernel_dir()
    so = out / f"{fnv1a64(cubin):016x}.so"
    if so.exists():
        return so
    cpp = out / f".{so.stem}.{os.getpid()}.cpp"
    cpp.write_text(host_source(src))
    tmp = out / f".{so.stem}.{os.getpid()}.so"
    try:
        r = subprocess.run(["g++", "-std=c++17", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-w", "-include",
                            str(HERE / "kernel.h"), "-o", str(tmp), str(cpp), "-lpthread"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"host build of a CUDA kernel failed:\n{r.stderr}\n{cpp.read_text()}")
        os.replace(tmp, so)
    finally:
        cpp.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return so


def install() -> None:
    """Make NVRTC compiles of this process also build the host copy the stand-in runs."""
    from tgc.backends import cuda
    if getattr(cuda.NVRTCCompiler.compile, "_standin", False):
        return
    compile_cubin = cuda.NVRTCCompiler.compile

    def compile(self, src: str) -> bytes:
        cubin = compile_cubin(self, src)
        host_build(src, cubin)
        return cubin
    compile._standin = True  # type: ignore[attr-defined]
    cuda.NVRTCCompiler.compile = compile  # type: ignore[method-assign]
