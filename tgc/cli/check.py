"""`tgc run --check`: compare the device's outputs with the float64 numpy reference, under the engine's one
tolerance rule (`tgc.engine.compare`).
"""

from __future__ import annotations

import numpy as np

from tgc.cli.outputs import display_values
from tgc.engine.compare import RTOL, Mismatch, compare

__all__ = ["RTOL", "Mismatch", "check_outputs", "compare"]


def check_outputs(outs: dict[str, np.ndarray], ref: dict[str, np.ndarray], dtype_names: dict[str, str],
                  rtol: float | None = None, scales: dict[str, np.ndarray] | None = None
                  ) -> tuple[list[Mismatch], float]:
    """Every mismatch over all outputs, and the worst error/tolerance ratio seen (for the `ok` line); `scales`
    are the outputs' error scales (`Program.reference_with_scale`)."""
    bad, worst = [], 0.0
    for name, got in outs.items():
        if name not in ref:
            bad.append(Mismatch(name, 0, got.size, reason="the reference computed no such output"))
            continue
        dt = dtype_names.get(name, "")
        m, ratio = compare(name, display_values(got, dt), ref[name], dt, rtol, (scales or {}).get(name))
        worst = max(worst, ratio)
        if m is not None:
            bad.append(m)
    return bad, worst
