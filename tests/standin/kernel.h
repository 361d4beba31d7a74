/* Host build of a generated CUDA C kernel for the CPU stand-in driver (see libcuda.c, tests/cuda_standin.py).
 * A launch runs on the calling OS thread: each GPU thread of a block is a fiber (a stack of its own and a
 * hand-rolled context switch, no OS thread), CUDA's thread ids and a thread's cp.async queue live in the fiber,
 * __shared__ arrays are statics (blocks run one at a time), and __syncthreads() is a counting barrier at which a
 * fiber yields to the next one. The fibers run in thread order, each until its next barrier (or its end): fiber
 * i runs ahead of fibers > i and behind fibers < i, so a read of another thread's shared memory without a
 * barrier between it and the write reads the 0xFF-filled or an older value, deterministically. Every fiber
 * passes the same number of barriers; one that ends while others wait at a barrier (a barrier that can never
 * complete: a hang on a GPU) is reported and ends the process. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

struct tgc_dim3 { unsigned x, y, z; };
/* CUDA's 16-byte vector types (a staged tile's copies load through them) */
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct tgc_async_copy { void *dst; const void *src; unsigned group; };
enum { TGC_ASYNC_MAX = 1024 };  /* copies in flight per thread, more than tgc's kernels issue */
/* one GPU thread: its saved stack pointer (or context), ids and per-thread state */
struct tgc_fiber {
#if defined(__x86_64__)
  void *sp;
#else
  ucontext_t ctx;
#endif
  tgc_dim3 idx;
  bool done;
  unsigned shuffle_turn;
  tgc_async_copy *async_queue;  /* TGC_ASYNC_MAX entries, allocated at the thread's first cp.async */
  unsigned async_pending, async_group;
};
static tgc_fiber tgc_main_fiber;  /* a launch of one thread per block runs on the caller's stack with this one */
static tgc_fiber *tgc_self = &tgc_main_fiber;
#define threadIdx (tgc_self->idx)
static tgc_dim3 blockIdx, blockDim, gridDim;
static unsigned tgc_threads = 1;

/* fibers: tgc_switch(&from, to) saves the callee-saved registers on the running stack, its stack pointer in
 * *from, and resumes `to`, a stack pointer saved the same way (or a fresh stack made by tgc_fiber_stack) */
#if defined(__x86_64__)
extern "C" void tgc_switch(void **from, void *to);
extern "C" void tgc_fiber_start();
asm(R"(
  .text
  .hidden tgc_switch
  .globl tgc_switch
  .type tgc_switch, @function
tgc_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tgc_switch, .-tgc_switch
  .hidden tgc_fiber_start
  .globl tgc_fiber_start
  .type tgc_fiber_start, @function
tgc_fiber_start:
  callq *%r12
  ud2
  .size tgc_fiber_start, .-tgc_fiber_start
)");
static void *tgc_scheduler_sp;
static inline void tgc_to_scheduler() { asm volatile("" ::: "memory"); tgc_switch(&tgc_self->sp, tgc_scheduler_sp); }
static inline void tgc_to_fiber(tgc_fiber *f) { tgc_self = f; tgc_switch(&tgc_scheduler_sp, f->sp); }
static void tgc_fiber_prepare(tgc_fiber *f, char *stack_top, void (*body)()) {
  void **sp = (void **)((uintptr_t)stack_top & ~(uintptr_t)15) - 8;
  unsigned csr[2] = {0, 0};
  asm volatile("stmxcsr %0; fnstcw %1" : "=m"(csr[0]), "=m"(*(unsigned short *)&csr[1]));
  memcpy(&sp[0], csr, 8);                                           /* mxcsr, x87 control word: the caller's */
  sp[1] = nullptr; sp[2] = nullptr; sp[3] = nullptr;                /* r15, r14, r13 */
  sp[4] = (void *)body;                                             /* r12: what tgc_fiber_start calls */
  sp[5] = nullptr; sp[6] = nullptr;                                 /* rbx, rbp */
  sp[7] = (void *)tgc_fiber_start;                                  /* tgc_switch's ret */
  f->sp = sp;                                   /* tgc_fiber_start runs with rsp 16-byte aligned, as a call needs */
}
#else
static ucontext_t tgc_scheduler_ctx;
static inline void tgc_to_scheduler() { swapcontext(&tgc_self->ctx, &tgc_scheduler_ctx); }
static inline void tgc_to_fiber(tgc_fiber *f) { tgc_self = f; swapcontext(&tgc_scheduler_ctx, &f->ctx); }
static void tgc_fiber_prepare(tgc_fiber *f, char *stack_top, void (*body)()) {
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = stack_top - (1 << 20) + 4096;
  f->ctx.uc_stack.ss_size = (1 << 20) - 4096;
  f->ctx.uc_link = nullptr;
  makecontext(&f->ctx, body, 0);
}
#endif

/* __syncthreads: the last thread to arrive goes on, the others yield until the barrier's generation changes */
static unsigned tgc_arrived;
static unsigned long tgc_barrier_generation, tgc_progress;
static inline void __syncthreads() {
  if (tgc_threads == 1) return;
  tgc_progress++;
  if (++tgc_arrived == tgc_threads) {
    tgc_arrived = 0;
    tgc_barrier_generation++;
    return;
  }
  unsigned long generation = tgc_barrier_generation;
  while (tgc_barrier_generation == generation) tgc_to_scheduler();
  asm volatile("" ::: "memory");
}

/* __shfl_xor_sync: every thread of the block puts its value in its slot, then reads lane `lane ^ offset` of its
 * warp (32 lanes) after a barrier. Two sets of slots, used in turn: a thread can be at most one shuffle ahead (the
 * next shuffle's barrier waits for every thread), so the set it writes is never one still being read; one barrier
 * a shuffle. The block's threads must all call it, as tgc's kernels do (whole warps run every shuffle); a mask
 * other than all lanes, or a block not made of whole warps, is refused. */
static unsigned long long tgc_shuffle_slots[2][1024];

template <class T> static inline T __shfl_xor_sync(unsigned mask, T value, int offset) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "a shuffled value is at most 8 bytes");
  if (mask != 0xffffffffu || tgc_threads % 32 != 0 || offset <= 0 || offset >= 32) __builtin_trap();
  unsigned me = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned long long *slots = tgc_shuffle_slots[tgc_self->shuffle_turn++ & 1];
  memcpy(&slots[me], &value, sizeof value);
  __syncthreads();
  T got;
  memcpy(&got, &slots[me ^ (unsigned)offset], sizeof got);
  return got;
}

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__
#define __align__(n) __attribute__((aligned(n)))
/* dynamic shared memory (cuLaunchKernel's sharedMemBytes): the generated `extern __shared__ ... tgc_smem[];` line
 * becomes `#define tgc_smem tgc_dynamic_smem` (tests/cuda_standin.py), one buffer for the block running now */
static unsigned char *tgc_dynamic_smem;

template <class T, class F> static inline T tgc_bits(F x) { T t; memcpy(&t, &x, sizeof t); return t; }
static inline float __int_as_float(int x) { return tgc_bits<float>(x); }
static inline float __uint_as_float(unsigned x) { return tgc_bits<float>(x); }
static inline int __float_as_int(float x) { return tgc_bits<int>(x); }
static inline unsigned __float_as_uint(float x) { return tgc_bits<unsigned>(x); }
static inline double __longlong_as_double(long long x) { return tgc_bits<double>(x); }

/* host versions of cuda.py's HALF_HELPERS (which use inline PTX) */
static inline float tgc_half2float(unsigned short h) { return (float)tgc_bits<_Float16>(h); }
static inline unsigned short tgc_float2half(float f) { return tgc_bits<unsigned short>((_Float16)f); }
static inline float tgc_bf162float(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
static inline unsigned short tgc_float2bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  /* cvt.rn.bf16.f32 gives the canonical NaN */
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* cp.async (cstyle.py's CP_ASYNC_HELPERS, sm_80+): a thread's copies are only queued, each with the number of the
 * group it will be committed in, and land when the thread waits for its group (cp.async.wait_group N: every
 * group but the N most recent), the latest a GPU may complete them: a kernel that reads a tile before waiting for
 * it and passing the barrier reads the 0xFF-filled or an older step's shared memory, and fails. */
static inline void tgc_cp_async_land(unsigned below) {  /* land the copies of groups < below, keep the others */
  tgc_fiber *t = tgc_self;
  unsigned kept = 0;
  for (unsigned i = 0; i < t->async_pending; i++) {
    if (t->async_queue[i].group < below) memcpy(t->async_queue[i].dst, t->async_queue[i].src, 16);
    else t->async_queue[kept++] = t->async_queue[i];
  }
  t->async_pending = kept;
}
static inline void tgc_cp_async_commit() { tgc_self->async_group++; }
template <int N> static inline void tgc_cp_async_wait_group() {
  tgc_cp_async_land(tgc_self->async_group >= N ? tgc_self->async_group - N : 0);
}
static inline void tgc_cp_async16(void *dst, const void *src) {
  tgc_fiber *t = tgc_self;
  if (((uintptr_t)dst | (uintptr_t)src) & 15) __builtin_trap();  /* cp.async's 16 bytes need 16-byte alignment */
  if (t->async_pending == TGC_ASYNC_MAX) __builtin_trap();  /* more copies in flight than tgc's kernels issue */
  if (!t->async_queue && !(t->async_queue = (tgc_async_copy *)malloc(TGC_ASYNC_MAX * sizeof(tgc_async_copy))))
    __builtin_trap();
  t->async_queue[t->async_pending++] = {dst, src, t->async_group};
}

static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

/* mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 with C = 0 (cstyle.py's MMA_HELPERS): every thread
 * of the block puts its 12 fragment values (rounded to the half type, as the packing does) in its slot; after a
 * barrier each thread rebuilds its warp's A (16x16) and B (16x8) from the 32 lanes' slots by the PTX ISA's fragment
 * layout (g = lane / 4, t = lane % 4; A rows g, g + 8 and columns 2t, 2t + 1, 2t + 8, 2t + 9; B rows 2t, 2t + 1,
 * 2t + 8, 2t + 9 and column g) and computes its 4 results (rows g, g + 8; columns 2t, 2t + 1) in f32; a barrier
 * again. Products of half floats are exact in f32; the sum runs in k order. */
static float tgc_mma_slots[1024][12];
static inline float4 tgc_mma_emulate(const float *v) {
  if (tgc_threads % 32 != 0) __builtin_trap();
  unsigned me = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  memcpy(tgc_mma_slots[me], v, sizeof tgc_mma_slots[me]);
  __syncthreads();
  float a[16][16], b[16][8];
  unsigned warp = me / 32 * 32;
  for (unsigned lane = 0; lane < 32; lane++) {
    unsigned g = lane / 4, t = lane % 4;
    const float *s = tgc_mma_slots[warp + lane];
    for (unsigned i = 0; i < 8; i++) a[g + 8 * ((i / 2) % 2)][2 * t + (i & 1) + 8 * (i / 4)] = s[i];
    for (unsigned i = 0; i < 4; i++) b[2 * t + (i & 1) + 8 * (i / 2)][g] = s[8 + i];
  }
  unsigned g = me % 32 / 4, t = me % 4;
  float d[4];
  for (unsigned i = 0; i < 4; i++) {
    float acc = 0.0f;
    for (unsigned k = 0; k < 16; k++) acc += a[g + 8 * (i / 2)][k] * b[k][2 * t + (i & 1)];
    d[i] = acc;
  }
  __syncthreads();
  return float4{d[0], d[1], d[2], d[3]};
}
static inline float4 tgc_mma_f16(float a0, float a1, float a2, float a3, float a4, float a5, float a6, float a7,
                                 float b0, float b1, float b2, float b3) {
  float v[12] = {a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3};
  for (float &x : v) x = tgc_half2float(tgc_float2half(x));
  return tgc_mma_emulate(v);
}
static inline float4 tgc_mma_bf16(float a0, float a1, float a2, float a3, float a4, float a5, float a6, float a7,
                                  float b0, float b1, float b2, float b3) {
  float v[12] = {a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3};
  for (float &x : v) x = tgc_bf162float(tgc_float2bf16(x));
  return tgc_mma_emulate(v);
}

static void tgc_run_blocks(void (*entry)(void **), void **params) {
  for (unsigned z = 0; z < gridDim.z; z++)
    for (unsigned y = 0; y < gridDim.y; y++)
      for (unsigned x = 0; x < gridDim.x; x++) {
        blockIdx = {x, y, z};
        entry(params);
        __syncthreads();  /* no thread starts the next block while another still reads this one's shared memory */
      }
}

static void (*tgc_entry)(void **);
static void **tgc_params;
static void tgc_fiber_main() {
  tgc_run_blocks(tgc_entry, tgc_params);
  tgc_self->done = true;
  tgc_progress++;
  tgc_to_scheduler();
  __builtin_trap();  /* a finished fiber is never resumed */
}

static int tgc_launch_threads(void (*entry)(void **), const unsigned *g, const unsigned *b, void **params);

extern "C" int tgc_launch(void (*entry)(void **), const unsigned *g, const unsigned *b, void **params,
                          unsigned shared_bytes) {
  tgc_dynamic_smem = shared_bytes ? new unsigned char[shared_bytes] : nullptr;
  if (shared_bytes) memset(tgc_dynamic_smem, 0xFF, shared_bytes);  /* unwritten shared memory reads as NaN */
  int rc = tgc_launch_threads(entry, g, b, params);
  delete[] tgc_dynamic_smem;
  tgc_dynamic_smem = nullptr;
  return rc;
}

/* Run the blocks: each GPU thread a fiber with a 1 MiB stack (reserved, not committed; a protected page below
 * it), resumed in thread order until all have run every block. A whole pass in which no fiber arrived at a
 * barrier or ended is a barrier that can never complete: reported, and the process ends. */
static int tgc_launch_threads(void (*entry)(void **), const unsigned *g, const unsigned *b, void **params) {
  gridDim = {g[0], g[1], g[2]};
  blockDim = {b[0], b[1], b[2]};
  tgc_threads = b[0] * b[1] * b[2];
  tgc_main_fiber = tgc_fiber{};
  tgc_self = &tgc_main_fiber;
  if (tgc_threads == 1) {
    tgc_run_blocks(entry, params);
    free(tgc_main_fiber.async_queue);
    return 0;
  }
  const size_t stack = (size_t)1 << 20;
  char *stacks = (char *)mmap(nullptr, stack * tgc_threads, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stacks == MAP_FAILED) return 1;
  tgc_fiber *fibers = new tgc_fiber[tgc_threads]();
  tgc_entry = entry;
  tgc_params = params;
  tgc_arrived = 0;
  for (unsigned i = 0; i < tgc_threads; i++) {
    mprotect(stacks + stack * i, 4096, PROT_NONE);  /* a stack overflow faults */
    fibers[i].idx = {i % b[0], i / b[0] % b[1], i / (b[0] * b[1])};
    tgc_fiber_prepare(&fibers[i], stacks + stack * (i + 1), tgc_fiber_main);
  }
  for (unsigned running = tgc_threads; running;) {
    unsigned long progress = tgc_progress;
    for (unsigned i = 0; i < tgc_threads; i++)
      if (!fibers[i].done) tgc_to_fiber(&fibers[i]);
    running = 0;
    for (unsigned i = 0; i < tgc_threads; i++) running += !fibers[i].done;
    if (running && tgc_progress == progress) {
      fprintf(stderr, "tgc stand-in: a __syncthreads() that can never complete (%u of %u threads of a block "
              "have ended, the others wait at a barrier)\n", tgc_threads - running, tgc_threads);
      fflush(stderr);
      abort();
    }
  }
  for (unsigned i = 0; i < tgc_threads; i++) free(fibers[i].async_queue);
  delete[] fibers;
  munmap(stacks, stack * tgc_threads);
  tgc_self = &tgc_main_fiber;
  return 0;
}
