"""Whether a matmul's right-hand side is worth packing into column panels (CPU, `schedule.pack_matmul_operands`).

Contract: `pack_pays(k, n, itemsize, rows, cache)` says whether the copy that packs a k x n operand (row
stride n * itemsize bytes) into panels of `PACK_PANEL` columns pays for itself in a matmul that reads it for
`rows` rows (row tiles x batches). Pure arithmetic over sizes and the private cache's geometry (`CacheGeometry`,
read once from sysfs); it opens no device and names no program.

The rule (docs/DESIGN.md, "Corpus kernels single-threaded: panels with few column tiles, packing by cache
sets"): a register tile reads one column panel (k rows of `PACK_PANEL` values) once per row block, so the panel
should stay in the private (L2) cache between row blocks. In place, the panel's rows lie a row stride apart; a
stride with a large power-of-two factor maps them all to a few cache sets (a 2048-byte stride: 64 of the 2048
set offsets of a 2 MiB 16-way L2), which then hold too few lines, and every row block reads the panel from the
shared cache again: packing (a contiguous panel) pays 1.7-2.5x there (128 x 1365 x 512, 77 x 1024 x 1024,
256 x 768 x 3072, single-thread). Where the panel's rows start on cache lines and its lines take at most
1/`PANEL_SHARE` of those of the sets they map to, the copy only costs: its traffic (~15-20% of a 77-row
matmul's time) against a kernel 7-20% slower in place, so packing is skipped for fewer than
`PACK_IN_PLACE_MAX_ROWS` rows (77 x 1000 x 576: 0.82x the time of copy + packed kernel alone, ~0.93x in the
llama odd block; 256 rows: break-even). Operands within the private cache are always packed (no column panels
outermost there: each row block reads the whole operand, contiguous only when packed).
"""

from __future__ import annotations

import functools
import glob
import math
from dataclasses import dataclass

PACK_PANEL = 32  # columns of a packed panel (the register tile's columns)
PACK_IN_PLACE_MAX_ROWS = 256  # from this many rows the packed kernel's edge pays for the copy anyway
PANEL_SHARE = 4  # the panel may take at most 1/PANEL_SHARE of the cache lines its sets hold (the left-hand
# side's rows and the output tile share the cache with it)


@dataclass(frozen=True)
class CacheGeometry:
    """A private cache: its size in bytes, associativity (ways) and line size in bytes."""

    size: int = 1 << 20
    ways: int = 16
    line: int = 64

    @property
    def period(self) -> int:
        """Bytes after which addresses map to the same set again (size / ways)."""
        return max(self.line, self.size // max(1, self.ways))


@functools.cache
def private_cache() -> CacheGeometry:
    """This machine's per-core (L2) cache geometry from sysfs; `CacheGeometry()` where unknown."""
    for path in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            with open(f"{path}/level") as f:
                if int(f.read().strip()) != 2:
                    continue
            with open(f"{path}/ways_of_associativity") as f:
                ways = int(f.read().strip())
            with open(f"{path}/number_of_sets") as f:
                sets = int(f.read().strip())
            with open(f"{path}/coherency_line_size") as f:
                line = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if ways > 0 and sets > 0 and line > 0:
            return CacheGeometry(size=ways * sets * line, ways=ways, line=line)
    return CacheGeometry()


def rows_on_lines(n: int, itemsize: int, cache: CacheGeometry | None = None) -> bool:
    """Whether the rows of a row-major operand of `n` columns start on cache lines (row stride a multiple of the
    line): else every vector load of a row spans two lines."""
    return (n * itemsize) % (cache or private_cache()).line == 0


def panel_fits_in_place(k: int, n: int, itemsize: int, cache: CacheGeometry, panel: int = PACK_PANEL) -> bool:
    """Whether a column panel of a k x n row-major operand (k rows of `panel` values, a row stride apart) is read
    well in place: its rows start on cache lines (else every vector load of a row spans two lines), and its
    lines fit the cache sets its rows map to, within 1/PANEL_SHARE of their lines."""
    if not rows_on_lines(n, itemsize, cache):  # vector loads across two lines (llama's 1365 columns: 1.6x)
        return False
    stride = n * itemsize
    lines_per_row = -(-panel * itemsize // cache.line)
    positions = cache.period // math.gcd(stride, cache.period)  # distinct set offsets the rows start at
    sets = min(cache.period // cache.line, positions * lines_per_row)
    return k * lines_per_row * PANEL_SHARE <= sets * cache.ways


def pack_pays(k: int, n: int, itemsize: int, rows: int, cache: CacheGeometry | None = None) -> bool:
    """Whether packing a k x n operand read by `rows` rows pays: many rows, an operand smaller than the
    private cache (no column panels outermost: each row block reads the whole operand, contiguous only when
    packed: 197 x 384 x 1152 took 1.9 ms in place against 1.1 + 0.17 ms packed), or a panel that does not fit
    its cache sets in place (module docstring)."""
    cache = cache or private_cache()
    if rows >= PACK_IN_PLACE_MAX_ROWS or k * n * itemsize < cache.size:
        return True
    return not panel_fits_in_place(k, n, itemsize, cache)


__all__ = ["PACK_IN_PLACE_MAX_ROWS", "PACK_PANEL", "CacheGeometry", "pack_pays", "panel_fits_in_place",
           "private_cache", "rows_on_lines"]
