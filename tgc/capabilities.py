"""What a device can do, declared in one place: the scheduler and the optimizer read these, never the
device's class or kind. Each renderer declares its `caps` (a `Capabilities`); a device may lower its
launch limits (`Device.caps` combines the two, without opening the device: rendering never needs it).
Runtime facts stay on the device (`max_buffer_bytes`, which may need the driver). Base layer: imports
nothing from tgc."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Capabilities:
    # how a kernel is launched: "cpu" (global_size[0] threads split the outer loop, `core_id` tells each its
    # slice) or "gpu" (a grid of work-groups of threads, with shared memory and barriers)
    launch: str = "cpu"
    vectors: bool = False  # vector UOps (UPCAST lanes become <N x T> operations); else every lane is scalar
    vector_widths: tuple[int, ...] = (16, 8, 4)  # the lane counts a vector UOp may have, widest first
    # loads and stores merged by `widen_memory` may take any lane count up to its widest (LLVM: a row of 7 columns
    # as 4 + 3 lanes, not 4 lanes and 3 scalars); else only the counts of `vector_widths`
    memory_any_width: bool = False
    decompose_transcendentals: bool = False  # exp2/log2/sin as polynomials (vectorizable) instead of device calls
    # scheduling (tgc/engine/schedule.py): choices for a cache hierarchy walked by few threads
    fuse_rows: bool = True  # a per-row reduction broadcast along its own row stays in its consumer kernel
    pack_matmul: bool = False  # a large matmul's right-hand side is copied into 32-column panels first
    # a row reduction's costly value stored into the output row and read back by the output pass
    # (tgc/codegen/rowreuse.py): a kernel that reads a buffer it writes; the PYTHON emulator runs such a kernel
    # one loop iteration at a time (~1000x slower), so it recomputes the value instead
    reread_rows: bool = True
    # GPU launch limits (tgc/codegen/opt.py): threads per work-group, shared memory per work-group (bytes),
    # work-groups along the first grid dimension, and the work-group size preferred where opts leave it open
    max_threads_per_block: int = 256
    max_shared_bytes: int = 32768
    max_grid: int = 2**31 - 1
    preferred_local_size: int = 256
    # lanes that exchange registers with a shuffle (`Ops.SHUFFLE`, CUDA's `__shfl_xor_sync`: 32); 0 where the
    # dialect renders none, and a work-group reduction combines its partials through a shared-memory tree
    shuffle_width: int = 0
    # warp-wide matrix multiply-accumulate (`Ops.MMA`, PTX `mma.sync` m16n8k16 with f32 accumulate: CUDA sm_80+)
    tensor_cores: bool = False
    # global -> shared copies that skip the registers (PTX `cp.async`, CUDA sm_80+): STAGE's 16-byte tile copies
    # are issued asynchronously and waited for before the tile's barrier (`opt.stage_tiles`); else plain loads
    async_copy: bool = False

    @property
    def gpu(self) -> bool:
        return self.launch == "gpu"

    def limited(self, threads: int | None = None, shared_bytes: int | None = None) -> Capabilities:
        """These capabilities with a device's own (lower) limits applied; None leaves a limit as it is."""
        return replace(
            self,
            max_threads_per_block=min(self.max_threads_per_block, threads or self.max_threads_per_block),
            preferred_local_size=threads or self.preferred_local_size,
            max_shared_bytes=min(self.max_shared_bytes, shared_bytes or self.max_shared_bytes))

