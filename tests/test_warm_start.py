"""A warm `tgc run` (every program in the program cache, tgc/progcache.py) is a whole process: what it imports is
its start-up time. These tests pin what the warm path must not import beyond what
tests/test_progcache.py already checks (neither llvmlite, the optimizer nor the front end): the modules that only
other paths need (threads for multi-thread launches, profiling statistics, file staging, `tgc worker`'s process
handling, the LLVM renderer).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np

import tgc

ROOT = pathlib.Path(__file__).resolve().parent.parent

# what the warm path of `tgc run FILE --random -D ...` printing its table must not import, and who needs it
NOT_ON_THE_WARM_PATH = {
    "concurrent.futures": "the CPU's thread pool, made when a launch first uses more than one thread",
    "statistics": "profile traces (tgc.profile)",
    "tgc.engine.multi": "device lists: their collectives and copies between devices (tgc.engine.executable)",
    "tempfile": "output files (-o), staged then renamed",
    "subprocess": "`tgc worker` (tgc.cli.cluster)",
    "tgc.backends.llvmir": "rendering LLVM IR: a cached binary is never rendered",
    "tgc.ir.kernel": "lowering",
    "llvmlite": "compiling",
}

SCRIPT = """
import sys
from tgc.cli.main import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    print("LOADED " + ",".join(sorted(m for m in sys.modules if m in set(sys.argv[0].split(",")))), file=sys.stderr)
"""


def test_the_llvm_renderers_alignment_is_the_one_the_cpu_allocator_assumes():
    """cpu.py states PARAM_ALIGN as a number so that a warm run need not import the renderer."""
    from tgc.backends.cpu import CPUAllocator
    from tgc.backends.llvmir import PARAM_ALIGN

    assert CPUAllocator.features.zero_copy_align == PARAM_ALIGN


def test_the_cpu_device_makes_its_renderer_on_first_use():
    from tgc.backends import get_device
    from tgc.backends.llvmir import LLVMRenderer

    dev = get_device("CPU")
    assert isinstance(dev.renderer, LLVMRenderer) and dev.renderer is dev.renderer


def test_a_warm_tgc_run_leaves_out_what_only_other_paths_need(tmp_path, monkeypatch):
    # the cold run, in this process (its kernels come from the session's compile cache): it stores the program
    env = {k: v for k, v in os.environ.items() if k not in ("TGC_VERIFY_BOUNDS", "DEBUG", "BEAM", "NOOPT")}
    env["TGC_CACHE_DIR"] = str(tmp_path / "cache")
    for name in ("TGC_VERIFY_BOUNDS", "DEBUG", "BEAM", "NOOPT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TGC_CACHE_DIR", env["TGC_CACHE_DIR"])
    from tgc import cache, progcache
    from tgc.backends import get_device

    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    out = tgc.load(str(ROOT / "kernels" / "softmax.tg")).run(device="CPU", x=x)["out0"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    assert cache.entries(progcache.TABLE), "the cold run stored no program"
    source = (ROOT / "kernels" / "softmax.tg").read_text()
    assert progcache.lookup(source, {"N": 4, "D": 8}, get_device("CPU")) is not None

    watched = ",".join(NOT_ON_THE_WARM_PATH) + ",tgc.api,rich"
    args = ["run", "kernels/softmax.tg", "--random", "-D", "N=4", "-D", "D=8"]
    r = subprocess.run([sys.executable, "-c", SCRIPT.replace("sys.argv[0]", repr(watched)), *args], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "out0" in r.stdout and "(4, 8)" in r.stdout  # the table was printed (rich: imported for it)
    loaded = r.stderr.rsplit("LOADED ", 1)[-1].strip().split(",")
    assert "tgc.api" not in loaded, "the run was not warm"
    assert "rich" in loaded  # (the watch works: the table's library is seen)
    wrong = {m: NOT_ON_THE_WARM_PATH[m] for m in loaded if m in NOT_ON_THE_WARM_PATH}
    assert not wrong, f"a warm run imported modules only other paths need: {wrong}"
