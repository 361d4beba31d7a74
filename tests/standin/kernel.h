/* Host build of a generated CUDA C kernel for the CPU stand-in driver (see libcuda.c, tests/cuda_standin.py).
 * CUDA's thread ids are thread-local variables, __shared__ arrays are statics (blocks run one at a time),
 * __syncthreads() is a pthread barrier over the threads of a block. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

struct tgc_dim3 { unsigned x, y, z; };
/* CUDA's 16-byte vector types (a staged tile's copies load through them) */
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
static thread_local tgc_dim3 threadIdx, blockIdx;
static tgc_dim3 blockDim, gridDim;
static pthread_barrier_t tgc_barrier;
static unsigned tgc_threads = 1;

static inline void __syncthreads() { if (tgc_threads > 1) pthread_barrier_wait(&tgc_barrier); }

/* __shfl_xor_sync: every thread of the block puts its value in its slot, then reads lane `lane ^ offset` of its
 * warp (32 lanes) after a barrier. Two sets of slots, used in turn: a thread can be at most one shuffle ahead (the
 * next shuffle's barrier waits for every thread), so the set it writes is never one still being read; one barrier
 * a shuffle. The block's threads must all call it, as tgc's kernels do (whole warps run every shuffle); a mask
 * other than all lanes, or a block not made of whole warps, is refused. */
static unsigned long long tgc_shuffle_slots[2][1024];
static thread_local unsigned tgc_shuffle_turn;
template <class T> static inline T __shfl_xor_sync(unsigned mask, T value, int offset) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "a shuffled value is at most 8 bytes");
  if (mask != 0xffffffffu || tgc_threads % 32 != 0 || offset <= 0 || offset >= 32) __builtin_trap();
  unsigned me = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned long long *slots = tgc_shuffle_slots[tgc_shuffle_turn++ & 1];
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
struct tgc_async_copy { void *dst; const void *src; unsigned group; };
static thread_local tgc_async_copy tgc_async_queue[1024];
static thread_local unsigned tgc_async_pending, tgc_async_group;
static inline void tgc_cp_async_land(unsigned below) {  /* land the copies of groups < below, keep the others */
  unsigned kept = 0;
  for (unsigned i = 0; i < tgc_async_pending; i++) {
    if (tgc_async_queue[i].group < below) memcpy(tgc_async_queue[i].dst, tgc_async_queue[i].src, 16);
    else tgc_async_queue[kept++] = tgc_async_queue[i];
  }
  tgc_async_pending = kept;
}
static inline void tgc_cp_async_commit() { tgc_async_group++; }
template <int N> static inline void tgc_cp_async_wait_group() {
  tgc_cp_async_land(tgc_async_group >= N ? tgc_async_group - N : 0);
}
static inline void tgc_cp_async16(void *dst, const void *src) {
  if (((uintptr_t)dst | (uintptr_t)src) & 15) __builtin_trap();  /* cp.async's 16 bytes need 16-byte alignment */
  if (tgc_async_pending == 1024) __builtin_trap();  /* more copies in flight than tgc's kernels issue */
  tgc_async_queue[tgc_async_pending++] = {dst, src, tgc_async_group};
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

struct tgc_thread { void (*entry)(void **); void **params; unsigned id; };

static void tgc_run_blocks(void (*entry)(void **), void **params) {
  for (unsigned z = 0; z < gridDim.z; z++)
    for (unsigned y = 0; y < gridDim.y; y++)
      for (unsigned x = 0; x < gridDim.x; x++) {
        blockIdx = {x, y, z};
        entry(params);
        __syncthreads();  /* no thread starts the next block while another still reads this one's shared memory */
      }
}

static void *tgc_thread_main(void *arg) {
  tgc_thread *t = (tgc_thread *)arg;
  threadIdx = {t->id % blockDim.x, t->id / blockDim.x % blockDim.y, t->id / (blockDim.x * blockDim.y)};
  tgc_run_blocks(t->entry, t->params);
  return nullptr;
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

static int tgc_launch_threads(void (*entry)(void **), const unsigned *g, const unsigned *b, void **params) {
  gridDim = {g[0], g[1], g[2]};
  blockDim = {b[0], b[1], b[2]};
  tgc_threads = b[0] * b[1] * b[2];
  if (tgc_threads == 1) {
    threadIdx = {0, 0, 0};
    tgc_run_blocks(entry, params);
    return 0;
  }
  pthread_barrier_init(&tgc_barrier, nullptr, tgc_threads);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  tgc_thread *ts = new tgc_thread[tgc_threads];
  pthread_t *ids = new pthread_t[tgc_threads];
  int rc = 0;
  for (unsigned i = 0; i < tgc_threads; i++) {
    ts[i] = {entry, params, i};
    if (pthread_create(&ids[i], &attr, tgc_thread_main, &ts[i]) != 0) { rc = 1; break; }  /* cannot recover */
  }
  for (unsigned i = 0; i < tgc_threads && rc == 0; i++) pthread_join(ids[i], nullptr);
  pthread_attr_destroy(&attr);
  pthread_barrier_destroy(&tgc_barrier);
  delete[] ts;
  delete[] ids;
  return rc;
}
