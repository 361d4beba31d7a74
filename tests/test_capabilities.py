"""Devices declare what they can do (`Device.caps`, tgc/capabilities.py); the scheduler and the optimizer
make device-dependent choices from it, never the front end."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.backends import get_device
from tgc.capabilities import Capabilities
from tgc.ir.uop import Ops

MATMUL = "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b"
DIMS = {"M": 512, "K": 512, "N": 512}


@pytest.mark.parametrize("kind, gpu", [("CPU", False), ("PYTHON", False), ("CUDA", True), ("OPENCL", True),
                                       ("METAL", True)])
def test_every_device_declares_its_launch(kind, gpu):
    dev = get_device(kind)  # creating a device opens nothing, so this works on every machine
    assert isinstance(dev.caps, Capabilities)
    assert dev.caps.gpu == gpu and dev.caps.launch == dev.launch_style
    assert dev.caps.fuse_rows == (not gpu)


def test_renderer_limits_are_declared_and_a_device_may_lower_them():
    cuda = get_device("CUDA").caps
    assert (cuda.max_threads_per_block, cuda.max_shared_bytes, cuda.max_grid) == (1024, 48 * 1024, 2**31 - 1)
    caps = Capabilities(launch="gpu", max_threads_per_block=1024, max_shared_bytes=48 * 1024)
    low = caps.limited(threads=64, shared_bytes=16384)
    assert (low.max_threads_per_block, low.max_shared_bytes, low.preferred_local_size) == (64, 16384, 64)
    assert caps.limited() == caps


def _tensor_graph_has_no_copy(prog: tgc.api.Program) -> bool:
    outs, _ = prog._trace(DIMS)
    return not any(u.op is Ops.CONTIGUOUS for o in outs for u in o.toposort())


def test_the_tensor_graph_of_a_matmul_is_device_neutral():
    assert _tensor_graph_has_no_copy(tgc.loads(MATMUL))


@pytest.mark.parametrize("device", ["CUDA", "OPENCL", "METAL", "PYTHON"])
def test_gpu_matmuls_have_no_packing_kernel(device):
    items = tgc.loads(MATMUL).schedule(DIMS, device=device)
    assert [i.name for i in items] == ["r_512_512_512"]


def test_cpu_matmuls_pack_their_right_hand_side():
    prog = tgc.loads(MATMUL)
    items = prog.schedule(DIMS, device="CPU")
    assert len(items) == 2 and items[0].output.op is Ops.CONTIGUOUS  # the packing copy, then the matmul
    assert items[1].bufs[2] is items[0].output and items[0].line == items[1].line == 3
    outs, _ = prog._trace(DIMS)
    assert items[1].output is outs[0]  # outputs keep their node: the realizer finds them


@pytest.mark.parametrize("src, dims, packed", [
    ("a: f32[B, M, K]\nb: f32[K, N]\nc = a @ b\nreturn c + 1.0, c", {"B": 2, "M": 8, "K": 512, "N": 1024}, True),
    # a weight read by one row is not packed (the copy would cost more than the one pass over it saves)
    ("a: f32[K]\nb: f32[K, N]\nreturn a @ b", {"K": 512, "N": 512}, False),
    ("a: f32[B, M, K]\nb: f32[B, K, N]\nreturn (a @ b).sum(axis=0)", {"B": 2, "M": 16, "K": 256, "N": 1024}, True),
])
def test_packed_and_unpacked_matmuls_agree_with_numpy(src, dims, packed):
    prog = tgc.loads(src)
    extra = len(prog.compile(device="CPU", dims=dims)) - len(prog.schedule(dims, device="CUDA"))
    assert (extra > 0) == packed, extra
    rng = np.random.default_rng(5)
    inputs = {d.name: rng.standard_normal(tuple(dims.get(s, s) for s in d.shape)).astype(np.float32)
              for d in prog.inputs}
    want = prog.reference(dims=dims, **inputs)
    for device in ("CPU", "PYTHON"):
        got = prog.run(device=device, dims=dims, **inputs)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-3)


def test_the_api_lists_devices_as_the_cli_does():
    import json

    from click.testing import CliRunner

    from tgc.cli.main import main
    rows = tgc.devices(info=False)
    by_kind = {r["device"]: r for r in rows}
    assert by_kind["CPU"]["available"] and by_kind["PYTHON"]["available"]
    assert {"CPU", "PYTHON", "CUDA", "OPENCL", "METAL", "REMOTE"} <= set(by_kind)
    assert all(r["available"] or r["why_not"] for r in rows)  # unavailable always says why
    full = tgc.devices()
    assert {r["device"] for r in full} == set(by_kind) and any(r["compiler"] for r in full)
    out = CliRunner().invoke(main, ["devices", "--json"])
    assert out.exit_code == 0
    assert [r["device"] for r in json.loads(out.output)] == [r["device"] for r in full]


def test_codegen_and_the_api_read_declared_facts_not_getattr():
    """The optimizer, the pipeline and the API ask a device or compiler only for what the base classes declare
    (`Device.caps`, `Device.cores`, `Compiler.assembly`, `Compiler.cache_identity`): no getattr/hasattr probing."""
    import ast
    import pathlib
    root = pathlib.Path(tgc.__file__).parent
    found = []
    for f in [*(root / "codegen").glob("*.py"), root / "api.py"]:
        for node in ast.walk(ast.parse(f.read_text())):
            probe = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if probe and node.func.id in ("getattr", "hasattr"):
                what = ast.unparse(node.args[0]) if node.args else ""
                if "dev" in what or "comp" in what or "cls" in what:
                    found.append(f"{f.name}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_a_device_declares_its_cores_and_the_optimizer_splits_across_them(monkeypatch):
    from tgc.backends.base import Device
    assert Device().cores == 1  # declared by every device, not probed
    monkeypatch.setenv("TGC_THREADS", "3")
    k = tgc.loads("a: f32[N]\nreturn a * 2").compile("PYTHON", dims={"N": 1 << 17})[0]
    assert k.global_size[0] == 3


def test_vector_widths_are_the_devices_declaration(monkeypatch):
    import dataclasses

    from tgc.codegen.opt import Opt, OptOps
    from tgc.codegen.pipeline import lower
    dev = get_device("CPU")
    item = tgc.loads("a: f32[N]\nreturn a * 2").schedule({"N": 64}, "CPU")[0]

    def widest() -> int:
        uops = lower(item.ast, dev, item.bufs, "k", opts=[Opt(OptOps.UPCAST, 0, 16)]).uops
        return max(u.dtype.count for u in uops if u.dtype is not None)

    assert widest() == 16
    caps = dataclasses.replace(dev.renderer.caps, vector_widths=(8, 4))
    narrow = type("Narrow", (type(dev.renderer),), {"caps": caps})
    monkeypatch.setattr(dev, "_renderer", narrow())  # (the CPU makes its renderer on first use: `renderer`)
    # 16 lanes are not a width it has: scalar copies (which widen_memory may merge again into a declared width)
    assert dev.caps.vector_widths == (8, 4) and widest() in (1, 4, 8)


def test_a_malformed_debug_setting_reads_as_zero_in_the_library(monkeypatch):
    from tgc.env import debug_level
    monkeypatch.setenv("DEBUG", "lots")
    assert debug_level() == 0
    monkeypatch.setenv("DEBUG", "6")
    assert debug_level() == 6
