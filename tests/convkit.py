"""The tests' numpy reference for conv2d (one function, so every convolution test checks against the same math)."""

from __future__ import annotations

import numpy as np


def conv_np(x: np.ndarray, w: np.ndarray, stride: int = 1, pad: int = 0, dil: int = 1, groups: int = 1) -> np.ndarray:
    """Direct float64 convolution (N, C, H, W) x (O, C/groups, KH, KW), for checking."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                hi, wi = i * dil, j * dil
                patch = xs[:, :, hi:hi + stride * (oh - 1) + 1:stride, wi:wi + stride * (ow - 1) + 1:stride]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
    return out
