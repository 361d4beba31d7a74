"""The CPU device's compiler: LLVM IR text -> x86-64 object bytes (llvmlite), and the rules choosing LLVM's passes
per kernel (`needs_slp`, `needs_unroll`).

A module of its own, importing neither numpy nor the CPU device, so that a compile worker
(`tgc.backends.compile_worker`), which only compiles, starts without them (numpy's import was ~0.1 s of CPU of each
worker's start, two workers per cold compile on two cores). `tgc.backends.cpu` uses and re-exports it.
"""

from __future__ import annotations

import os
import re
import threading

from tgc.backends.base import Compiler
from tgc.errors import CompileError


def _llvmlite_version() -> str:
    """llvmlite's installed version: from the name of its `.dist-info` directory on `sys.path` (a warm run from the
    program cache needs it for the cache key; importing `importlib.metadata` to read it cost ~50 ms), else from
    `importlib.metadata`."""
    import sys

    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith("llvmlite-") and name.endswith(".dist-info"):
                return name[len("llvmlite-"):-len(".dist-info")]
    from importlib.metadata import version
    return version("llvmlite")


class LLVMCompiler(Compiler):
    """LLVM IR text -> x86-64 object bytes, at -O3 for the host CPU (the SLP vectorizer only where the body has no
    vectors yet: `needs_slp`; the loop unrollers not on fills: `needs_unroll`)."""

    name = "llvmlite"

    def __init__(self) -> None:
        self._tm = None
        self._lock = threading.Lock()

    @property
    def version(self) -> str:  # type: ignore[override]
        """llvmlite's version and the host CPU's features, read without importing llvmlite."""
        global _VERSION
        if _VERSION is None:
            _VERSION = f"{_llvmlite_version()}-{_cpu_fingerprint()}"
        return _VERSION

    def _target_machine(self):
        if self._tm is None:
            from tgc.backends.elf import make_target_machine
            _set_llvm_options()
            self._tm = make_target_machine(opt=3)
        return self._tm

    def _parsed(self, src: str):
        """`src` parsed, given this machine's triple and data layout, and verified: the module `compile` optimizes."""
        import llvmlite.binding as llvm
        tm = self._target_machine()
        try:
            mod = llvm.parse_assembly(src)
            mod.triple = tm.triple
            mod.data_layout = str(tm.target_data)
            mod.verify()
        except RuntimeError as e:
            raise CompileError(f"LLVM rejected the kernel: {e}") from None
        return mod

    def _module(self, src: str, printed: list[str] | None = None):
        """`src` parsed (`_parsed`) and optimized; LLVM's print of it as parsed, before the optimizer, appended to
        `printed` if given."""
        import llvmlite.binding as llvm
        mod = self._parsed(src)
        if printed is not None:
            printed.append(str(mod))
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = needs_slp(src)
        pto.loop_unrolling = needs_unroll(src)
        pb = llvm.create_pass_builder(self._target_machine(), pto)
        pb.getModulePassManager().run(mod, pb)
        return mod

    def compile(self, src: str) -> bytes:
        with self._lock:  # llvmlite's target machine is not thread-safe
            mod = self._module(src)
            return bytes(self._target_machine().emit_object(mod))

    def compile_printed(self, src: str) -> tuple[bytes, str]:
        """`compile(src)`, and LLVM's print of the very module it compiled as parsed (canonical text: one
        instruction a line, LLVM's spelling; `remote.shortproof` proves that text, not the client's)."""
        with self._lock:
            printed: list[str] = []
            mod = self._module(src, printed)
            return bytes(self._target_machine().emit_object(mod)), printed[0]

    def printed(self, src: str) -> str:
        """LLVM's print of `src` as `compile` parses it (`_parsed`), before the optimizer; CompileError if LLVM
        refuses the text."""
        with self._lock:
            return str(self._parsed(src))

    def optimized_ir(self, src: str) -> str:
        with self._lock:
            return str(self._module(src))

    source_assembly = True

    def assembly(self, src: str) -> str:
        with self._lock:
            return self._target_machine().emit_assembly(self._module(src))


_VERSION: str | None = None

# LLVM options for every compile of this process (llvmlite's LLVM is one per process). Dead-store elimination
# walks up from each store looking for earlier stores it makes dead, by default 90 steps: on a tile stored lane by
# lane (256 scalar stores: a convolution's output channels) that walk was the largest pass of the pipeline (0.19 s
# of a ResNet convolution's 0.7 s). tgc's kernels store each output once, so the shorter walk finds the same
# (none): every object compared (the bench workloads', the corpus', ResNet-50's) was byte-identical, and LLVM
# took ~30% less time on the convolutions.
LLVM_OPTIONS = ("-dse-memoryssa-walklimit=10",)
_OPTIONS_SET = False


def _set_llvm_options() -> None:
    global _OPTIONS_SET
    if not _OPTIONS_SET:
        import llvmlite.binding as llvm
        for option in LLVM_OPTIONS:
            llvm.set_option("tgc", option)
        _OPTIONS_SET = True

_VECTOR_TYPE = re.compile(r"<\d+ x ")  # an LLVM vector type: `<16 x float>`
_LANE_BY_LANE = re.compile(r"extractelement|insertelement .*, i32 [1-9]")  # a lane read, or a lane past 0 written
# scalar float arithmetic beside the vectors (a fused row statistic): straight-line code SLP may pair up
_SCALAR_MATH = re.compile(r"= (?:f(?:add|sub|mul|div|neg)|call)(?: [a-z]+)* (?:float|double|half) ")


_LABEL = re.compile(r"^([A-Za-z_][\w.]*):")  # a basic block's label, at the start of its line


def _lane_moves_only_after_loops(src: str) -> bool:
    """Whether every lane-by-lane move of the kernel is in a block that follows a loop's end (`loopN_exit`): the
    epilogue of a register tile, run once per tile after its reduction (a convolution's output channels, stored
    one lane at a time into an NCHW output, a residual read the same way), not in any loop's body."""
    block = ""
    for line in src.splitlines():
        m = _LABEL.match(line)
        if m:
            block = m.group(1)
        elif _LANE_BY_LANE.search(line) and not block.endswith("_exit"):
            return False
    return True


def needs_slp(src: str) -> bool:
    """Whether LLVM's SLP vectorizer (straight-line code -> vectors) runs on a kernel: not where tgc already wrote
    the body in whole vectors (a register tile of vector loads, broadcasts and vector stores). There it changed
    no object measured (100+ kernels: the bench workloads', the corpus', ResNet-50's) and took 10-30% of LLVM's
    time. Nor where the only lane-by-lane moves are a tile's epilogue after its loops
    (`_lane_moves_only_after_loops`: the convolution tiles of ResNet-50, the corpus' ResNet bottleneck,
    MobileNet, ViT and U-Net): SLP took 25-45% of LLVM's time on them, their objects were byte-identical but for
    the U-Net's 6 convolutions, where SLP turned the lane stores into shuffles (measured 0.67x slower on one of
    them). It still runs where the body has no vectors, moves values lane by lane inside a loop (gathered loads)
    or does scalar float math beside them: there it changed the code (1.45x faster on one MLP-Mixer kernel)."""
    if _VECTOR_TYPE.search(src) is None or _SCALAR_MATH.search(src) is not None:
        return True
    return _LANE_BY_LANE.search(src) is not None and not _lane_moves_only_after_loops(src)


# what makes a loop worth LLVM's unroller: a read of a buffer (a load through an address, a masked load or a
# gather) or arithmetic on floats (or a call: an intrinsic)
_READS_OR_MATH = re.compile(r"= load [^\n]*ptr %v\d+|@llvm\.masked\.(?:load|gather)|"
                            r"= f(?:add|sub|mul|div|neg|rem|cmp) |= call ")


def needs_unroll(src: str) -> bool:
    """Whether LLVM's loop unrollers (full and partial) run on a kernel: not on a fill, a kernel that reads no
    buffer and computes no float (a constant or an index stored over a range: ONNX's ConstantOfShape weights and
    their packings, zeros, masks). Its loops are bound by their stores: a 64 Ki-float fill unrolled fully into
    1024 vector stores ran no faster (3.2 against 2.9 us) and took 0.27 s of LLVM instead of 0.008 s; the 19
    fills of ResNet-50's light model 0.82 -> 0.18 s of LLVM, the largest (33 MB) 146 -> 161 us, once per load
    (weight fills run in a program's prelude). Everything else is unrolled as before: with the unroller off,
    ResNet's 3x3 convolution tiles ran 1.1-1.5x slower."""
    return _READS_OR_MATH.search(src) is not None


def _cpu_fingerprint() -> str:
    """A short hash of the CPU model and flags: objects built for one CPU must not load on another."""
    import hashlib
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        import platform
        lines = [platform.machine(), platform.processor()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


COMPILER = LLVMCompiler()  # the one per process (`CPUDevice.compiler`)
