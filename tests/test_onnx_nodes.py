"""ONNX's own node conformance cases (`onnx.backend.test.case.node.collect_testcases`, expected outputs included)
run through tgc on the PYTHON emulator device (no LLVM compile per case, so the ~1850 cases fit the test budget),
against tests/data/onnx_node_xfail.txt: every case not listed must pass with the case's own rtol/atol, dtype and
shape, and every listed case must still fail (so the list only shrinks). `python tests/onnx_cases.py [DEVICE]`
runs the same cases by hand on any device."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("onnx")

from onnx_cases import plain_cases, run_case  # noqa: E402

XFAIL = Path(__file__).parent / "data" / "onnx_node_xfail.txt"


def _expected_failures() -> dict[str, str]:
    out = {}
    for line in XFAIL.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, why = line.partition("\t")
            out[name] = why
    return out


@pytest.mark.slow
def test_onnx_node_conformance():
    xfail = _expected_failures()
    cases = plain_cases()
    names = {c.name for c in cases}
    unexpected, now_pass = [], []
    passed = 0
    for case in cases:
        try:
            why = run_case(case, "PYTHON")
        except Exception as e:  # noqa: BLE001 - a crash is a failure with its reason
            why = f"crash: {type(e).__name__}: {e}"
        if why is None:
            passed += 1
            if case.name in xfail:
                now_pass.append(case.name)
        elif case.name not in xfail:
            unexpected.append(f"{case.name}: {why}")
    stale = sorted(set(xfail) - names)
    assert not unexpected, f"{len(unexpected)} cases fail that are not expected to:\n" + "\n".join(unexpected)
    assert not now_pass, "these cases pass now: remove them from " + XFAIL.name + ":\n" + "\n".join(now_pass)
    assert not stale, "listed cases that onnx no longer has: " + ", ".join(stale)
    assert passed == len(cases) - len(xfail)
