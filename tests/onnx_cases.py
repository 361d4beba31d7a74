"""ONNX's node conformance cases (`onnx.backend.test.case.node.collect_testcases`) run through tgc: shared by
tests/test_onnx_nodes.py and `python tests/onnx_cases.py` (which prints the pass list to refresh the
expected-failure file). A case passes when every output matches the case's expected one with the case's own
rtol/atol (and dtype and shape); inputs that decide shapes (Reshape's shape, ...) are made initializers first,
since tgc compiles for static shapes (`NeedStatic`). A case whose model has a data-dependent output shape
(`NeedHost`: NonZero, Unique, NonMaxSuppression on inputs) runs in stages through `tgc.staged.StagedModel`, and
so does a case whose every input decides a shape (ConstantOfShape, Range, the window functions, If on an input,
MelWeightMatrix): folded at load by this harness nothing would be left to run, so its inputs are given at run
time to the StagedModel, which makes each such value a constant of the stage program translated for it (one
program per distinct value; docs/DESIGN.md, "ONNX in", says what passing means for these)."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import numpy as np


def plain_cases() -> list[Any]:
    """The node cases whose inputs and outputs are plain tensors (no sequences, optionals or maps)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    out = []
    for c in cases:
        if c.model is None or not c.data_sets:
            continue
        ok = all(v.type.HasField("tensor_type") for v in [*c.model.graph.input, *c.model.graph.output])
        if ok:
            out.append(c)
    return out


def prepare(case: Any) -> tuple[Any, Any, list[str]]:
    """(translation, model, names of inputs made initializers) for one case."""
    import onnx
    from onnx import numpy_helper

    from tgc.onnx import NeedStatic, translate

    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    inputs, _ = case.data_sets[0]
    by_name = {v.name: _array(arr) for v, arr in zip(model.graph.input, inputs)}
    fixed: list[str] = []
    for _ in range(len(model.graph.input) + 1):
        try:
            return translate(model, case.name), model, fixed
        except NeedStatic as e:
            if e.name not in by_name or e.name in fixed:
                raise
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(by_name[e.name]), e.name))
            fixed.append(e.name)
    raise RuntimeError("unreachable")


def run_case(case: Any, device: str = "PYTHON") -> str | None:
    """None when the case passes, else why not (one line)."""
    from tgc.api import Program
    from tgc.errors import TgcError
    from tgc.onnx import NeedHost

    try:
        tr, model, fixed = prepare(case)
    except NeedHost:  # a data-dependent output shape: the model runs in stages (tgc.staged)
        return _run_staged(case, device)
    except TgcError as e:
        return f"translate: {e.msg}"
    names = {tg: n for n, tg in [*tr.inputs.items(), *tr.outputs.items()]}
    try:
        prog = Program(tr.source, filename=case.name, weights=tr.weights, names=names)
    except TgcError as e:
        return f"load: {e.msg}"
    real = [v.name for v in model.graph.input if v.name not in fixed]
    if fixed and not real:  # every input decides a shape: folded here, no input would reach a kernel; run in
        return _run_staged(case, device)  # stages instead, the inputs given at run time (see the docstring)

    def run(given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        given = {k: (_bf16_bits(v) if v.dtype.name == "bfloat16" else v) for k, v in given.items() if k in real}
        return prog.run(device=device, inputs=given)

    return _run_data_sets(case, run)


def _run_staged(case: Any, device: str) -> str | None:
    """A case whose model needs host steps (NonZero, Unique, ...), run by `tgc.staged.StagedModel`."""
    from tgc.staged import StagedModel

    staged = StagedModel(case.model, case.name)
    return _run_data_sets(case, lambda given: staged.run(device=device, inputs=given))


def _run_data_sets(case: Any, run: Any) -> str | None:
    """`run(inputs by name)` on each of the case's data sets: None when every output matches, else why not."""
    from tgc.errors import TgcError

    for inputs, expected in case.data_sets:
        try:
            got = run({v.name: _array(a) for v, a in zip(case.model.graph.input, inputs)})
        except TgcError as e:
            return f"run: {e.msg.splitlines()[0]}"
        why = _compare(case, got, expected)
        if why:
            return why
    return None


def _compare(case: Any, got: dict, expected: list) -> str | None:
    """None when every output matches its expected array (dtype, shape, the case's rtol/atol)."""
    for o, want in zip(case.model.graph.output, expected):
        have = got[o.name]
        want = _array(want)
        if want.dtype.name == "bfloat16":  # tgc gives bf16 results as f32 arrays (numpy has no bf16)
            want = want.astype(np.float32)
        if have.shape != want.shape:
            return f"output {o.name}: shape {have.shape} != {want.shape}"
        if have.dtype != want.dtype:
            return f"output {o.name}: dtype {have.dtype} != {want.dtype}"
        if want.dtype.kind in "fc":
            if not np.allclose(have, want, rtol=case.rtol, atol=case.atol, equal_nan=True):
                err = np.nanmax(np.abs(have.astype(np.float64) - want))
                return f"output {o.name}: max error {err:.3g}"
        elif not np.array_equal(have, want):
            return f"output {o.name}: values differ"
    return None


def _array(item: Any) -> np.ndarray:
    """A case's input or expected output as numpy (some cases hold TensorProtos, as ONNX's runner normalizes)."""
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(item) if isinstance(item, TensorProto) else np.asarray(item)


def _bf16_bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view(np.uint16)


if __name__ == "__main__":
    import time

    device = sys.argv[1] if len(sys.argv) > 1 else "PYTHON"
    only = sys.argv[2] if len(sys.argv) > 2 else ""
    os.environ.setdefault("TGC_PROGRAM_CACHE", "0")
    t0 = time.time()
    passed, failed = 0, 0
    for case in plain_cases():
        if only and only not in case.name:
            continue
        t = time.time()
        try:
            why = run_case(case, device)
        except Exception as e:  # noqa: BLE001 - a crash is one more failure to list
            why = f"crash: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        dt = time.time() - t
        if why is None:
            passed += 1
            print(f"PASS {case.name} {dt:.2f}s", flush=True)
        else:
            failed += 1
            print(f"FAIL {case.name} {dt:.2f}s {why}", flush=True)
    print(f"# {passed} passed, {failed} failed in {time.time() - t0:.0f} s", flush=True)
