"""bench/bench.py prints `tgc beam < 60 s` (issue 14) for every workload: met or not from the search's seconds,
not judged where every winner came from the cache (nothing was searched)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture()
def bench(monkeypatch):
    # importing bench.py re-executes the process without a forced OpenBLAS core type unless told it already did
    monkeypatch.setenv("TGC_BENCH_UNFORCED", "test")
    spec = importlib.util.spec_from_file_location("tgc_bench_script", ROOT / "bench" / "bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_beam_time_target_text_and_verdicts(bench):
    assert bench.BEAM_TIME_TARGET_S == 60.0
    assert bench._target_text("beam time", bench.BEAM_TIME_TARGET_S) == "tgc beam < 60 s"
    met = lambda s, cached=False: bench._target_met("beam time", 60.0, {"beam_search_s": s, "beam_cached": cached})  # noqa: E731
    assert met(12.5) is True and met(59.9) is True
    assert met(60.0) is False and met(200.0) is False
    assert met(0.01, cached=True) is None  # every winner cached: nothing was searched
    assert met(None) is None  # --no-beam


def test_the_bench_beams_as_the_cli_does_by_default(bench):
    """The bench's search is `Program.beam` with its defaults, which are the CLI's (width and no --force)."""
    import inspect

    import tgc
    from tgc.cli.main import beam_
    src = inspect.getsource(bench.main)
    assert "prog.beam(dims=prog.bind(w[\"inputs\"], dims)[0])" in src
    width = next(p for p in beam_.params if p.name == "width")
    assert inspect.signature(tgc.Program.beam).parameters["width"].default == width.default
