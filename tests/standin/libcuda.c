/* A CPU stand-in for the CUDA driver (libcuda.so.1), for tests on machines without a GPU.
 *
 * cuda-bindings loads it like the real driver (first on LD_LIBRARY_PATH) and resolves its entry points
 * through cuGetProcAddress_v2. Memory is host memory; a "module" is a host shared library built from the
 * kernel's CUDA C by tests/cuda_standin.py and found by a hash of the cubin in $TGC_STANDIN_DIR; a launch
 * runs that copy with one fiber per GPU thread of a block (kernel.h; blocks one after another), synchronously.
 *
 * Knobs for tests (environment):
 *   TGC_STANDIN_DIR             where the host-built kernels lie (<fnv1a64 of the cubin>.so)
 *   TGC_STANDIN_DRIVER_VERSION  what cuDriverGetVersion reports (default 13000)
 *   TGC_STANDIN_FAULT           a kernel name: its launches "fault" like an illegal address, reported
 *                               asynchronously (the launch succeeds, later calls fail until a context reset)
 *   TGC_STANDIN_DEVICES         how many devices cuDeviceGetCount reports (default 1)
 *   TGC_STANDIN_SHARED_BYTES    what the max-shared-memory-per-block attribute reports (default 49152)
 *   TGC_STANDIN_SHARED_OPTIN_BYTES  the opt-in maximum (attribute 97; default: TGC_STANDIN_SHARED_BYTES's value).
 *                               As on a GPU, a launch with more dynamic shared memory than 48 KiB fails unless
 *                               cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) raised the function's limit
 *   TGC_STANDIN_CC              the compute capability, e.g. "7.0" (default "9.0")
 *
 * Memory is hardened so that out-of-bounds accesses and reads of unwritten memory fail loudly: every
 * allocation ends against a protected page (the byte after a buffer's last one faults; a buffer starts at
 * a page end minus its size, so it keeps the natural alignment of its elements), and fresh memory is filled
 * with 0xFF bytes (a float NaN, an int -1), never zeros. A fault inside a kernel prints the kernel's name and
 * the address on stderr and ends the process (a real GPU reports an illegal address).
 *
 * Graphs (cuGraphCreate, cuGraphAddKernelNode with the 12.0+ node parameters, cuGraphInstantiateWithFlags,
 * cuGraphLaunch) hold kernel nodes in the order added (each may depend only on nodes added before it) and
 * run them with cuLaunchKernel, in that order. Unlike the real driver, a node keeps the caller's kernelParams
 * pointers instead of copying the values (tgc keeps them alive as long as the graph).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct ctx_s *CUcontext;
typedef struct module_s *CUmodule;
typedef struct func_s *CUfunction;
typedef struct event_s *CUevent;
typedef void *CUstream;
typedef struct graph_s *CUgraph;
typedef struct graph_s *CUgraphExec;
typedef void *CUgraphNode;  /* (void *)(index + 1) in its graph */

enum {
  OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, NO_DEVICE = 100, INVALID_DEVICE = 101,
  INVALID_IMAGE = 200, INVALID_CONTEXT = 201, INVALID_HANDLE = 400, NOT_FOUND = 500, NOT_READY = 600,
  ILLEGAL_ADDRESS = 700, LAUNCH_OUT_OF_RESOURCES = 701, UNKNOWN = 999
};

struct ctx_s { int device; CUresult sticky; int generation; };
struct module_s { void *so; int generation; };
typedef int (*launch_fn)(void (*)(void **), const unsigned *, const unsigned *, void **, unsigned);
struct func_s { CUmodule module; void (*entry)(void **); launch_fn launch; char name[256]; int max_dynamic_shared; };
static long last_dynamic_shared_set = 0;  /* the last value cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) set */
static int shared_per_block(void) { const char *s = getenv("TGC_STANDIN_SHARED_BYTES"); return s ? atoi(s) : 49152; }
static int shared_opt_in(void) {
  const char *s = getenv("TGC_STANDIN_SHARED_OPTIN_BYTES");
  return s ? atoi(s) : shared_per_block();
}
static int compute_capability(int minor) {
  const char *s = getenv("TGC_STANDIN_CC");
  int major = 9, min = 0;
  if (s) sscanf(s, "%d.%d", &major, &min);
  return minor ? min : major;
}
struct event_s { double t; };

static struct ctx_s primary = {0, OK, 0};
static int initialized = 0;
static __thread CUcontext current = NULL;
static pthread_mutex_t launch_lock = PTHREAD_MUTEX_INITIALIZER;
static long n_modules_live = 0, n_unload_without_ctx = 0, n_launches = 0, n_resets = 0;

static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec * 1e-9; }
static int n_devices(void) { const char *s = getenv("TGC_STANDIN_DEVICES"); return s ? atoi(s) : 1; }

/* a call that needs the current context: no context -> INVALID_CONTEXT; a pending fault -> that fault */
static CUresult need_ctx(void) {
  if (!initialized) return NOT_INITIALIZED;
  if (current == NULL) return INVALID_CONTEXT;
  return current->sticky;
}

CUresult cuInit(unsigned flags) { (void)flags; initialized = 1; return OK; }
CUresult cuDriverGetVersion(int *v) {
  const char *s = getenv("TGC_STANDIN_DRIVER_VERSION");
  *v = s ? atoi(s) : 13000;
  return OK;
}
CUresult cuDeviceGetCount(int *n) { if (!initialized) return NOT_INITIALIZED; *n = n_devices(); return OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (!initialized) return NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= n_devices()) return INVALID_DEVICE;
  *d = ordinal; return OK;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) { (void)d; snprintf(name, len, "tgc CPU stand-in"); return OK; }
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { (void)d; *bytes = (size_t)1 << 30; return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
  (void)d;
  switch (attr) {
    case 1: *v = 1024; break;                       /* max threads per block */
    case 2: case 3: *v = 1024; break;               /* max block dim x, y */
    case 4: *v = 64; break;                         /* max block dim z */
    case 5: *v = 2147483647; break;                 /* max grid dim x */
    case 6: case 7: *v = 65535; break;              /* max grid dim y, z */
    case 8: *v = shared_per_block(); break;         /* max shared memory per block */
    case 97: *v = shared_opt_in(); break;           /* max shared memory per block, opt-in */
    case 10: *v = 32; break;                        /* warp size */
    case 13: *v = 1000000; break;                   /* clock rate, kHz */
    case 16: *v = 2; break;                         /* multiprocessor count */
    case 36: *v = 1000000; break;                   /* memory clock rate, kHz */
    case 37: *v = 256; break;                       /* memory bus width, bits */
    case 75: *v = compute_capability(0); break;     /* compute capability major */
    case 76: *v = compute_capability(1); break;     /* compute capability minor */
    default: *v = 0;
  }
  return OK;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  if (!initialized) return NOT_INITIALIZED;
  if (d < 0 || d >= n_devices()) return INVALID_DEVICE;
  *c = &primary; return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return OK; }
CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
  (void)d;
  primary.sticky = OK; primary.generation++; n_resets++;
  return OK;
}
CUresult cuCtxSetCurrent(CUcontext c) { current = c; return OK; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return OK; }
CUresult cuCtxPushCurrent_v2(CUcontext c) { current = c; return OK; }
CUresult cuCtxPopCurrent_v2(CUcontext *c) { if (c) *c = current; current = NULL; return OK; }
CUresult cuCtxSynchronize(void) { return need_ctx(); }

/* An allocation of n bytes: [a header page][the data pages][a protected guard page], the buffer placed so that
 * its last byte is the last one before the guard page. The header page holds the mapping's length; it is the
 * page before the one the buffer starts in (the data pages' slack is less than a page). */
static size_t page_size(void) { static size_t p; if (!p) p = (size_t)sysconf(_SC_PAGESIZE); return p; }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  CUresult r = need_ctx(); if (r) return r;
  size_t page = page_size(), need = n ? n : 1, data = (need + page - 1) / page * page, total = data + 2 * page;
  unsigned char *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return OUT_OF_MEMORY;
  if (mprotect(base + page + data, page, PROT_NONE) != 0) { munmap(base, total); return OUT_OF_MEMORY; }
  memcpy(base, &total, sizeof total);
  unsigned char *buf = base + page + data - need;
  memset(buf, 0xFF, need);  /* fresh memory is never zeros: a read of an unwritten element shows */
  *p = (CUdeviceptr)(uintptr_t)buf; return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  CUresult r = need_ctx(); if (r) return r;
  if (!p) return OK;
  size_t page = page_size(), total;
  unsigned char *base = (unsigned char *)((uintptr_t)p & ~(uintptr_t)(page - 1)) - page;
  memcpy(&total, base, sizeof total);
  munmap(base, total); return OK;
}

/* a fault in a kernel (a guard page): say which kernel and where, then end the process as the signal would */
static const char *volatile running_kernel = NULL;
static struct sigaction old_segv, old_bus;
static void on_fault(int sig, siginfo_t *info, void *uctx) {
  (void)uctx;
  char msg[512];
  int len = snprintf(msg, sizeof msg, "tgc stand-in: kernel '%s' faulted at address %p (out of bounds of its "
                     "buffer: guard page)\n", running_kernel ? running_kernel : "(none: not in a kernel)",
                     info->si_addr);
  if (len > 0) { ssize_t w = write(2, msg, (size_t)len < sizeof msg ? (size_t)len : sizeof msg - 1); (void)w; }
  sigaction(sig, sig == SIGBUS ? &old_bus : &old_segv, NULL);  /* then whoever handled it before (faulthandler) */
  raise(sig);
}
static void install_fault_handler(void) {
  static int done = 0;
  if (done) return;
  done = 1;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  CUresult r = need_ctx(); if (r) return r;
  memcpy((void *)(uintptr_t)dst, src, n); return OK;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  CUresult r = need_ctx(); if (r) return r;
  memcpy(dst, (const void *)(uintptr_t)src, n); return OK;
}

/* the size of an ELF image from its header (section headers are last in a cubin) */
static size_t image_size(const unsigned char *p) {
  if (memcmp(p, "\x7f" "ELF", 4) != 0) return strlen((const char *)p);  /* PTX text */
  uint64_t shoff, phoff; uint16_t shentsize, shnum, phentsize, phnum;
  memcpy(&phoff, p + 32, 8); memcpy(&shoff, p + 40, 8);
  memcpy(&phentsize, p + 54, 2); memcpy(&phnum, p + 56, 2); memcpy(&shentsize, p + 58, 2); memcpy(&shnum, p + 60, 2);
  uint64_t a = shoff + (uint64_t)shentsize * shnum, b = phoff + (uint64_t)phentsize * phnum;
  return a > b ? a : b;
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ULL; }
  return h;
}

CUresult cuModuleLoadData(CUmodule *m, const void *image) {
  CUresult r = need_ctx(); if (r) return r;
  const char *dir = getenv("TGC_STANDIN_DIR");
  if (!dir) { fprintf(stderr, "tgc stand-in: TGC_STANDIN_DIR is not set\n"); return INVALID_IMAGE; }
  char path[4096];
  uint64_t h = fnv1a((const unsigned char *)image, image_size((const unsigned char *)image));
  snprintf(path, sizeof path, "%s/%016llx.so", dir, (unsigned long long)h);
  void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!so) { fprintf(stderr, "tgc stand-in: no host build of this cubin: %s\n", dlerror()); return INVALID_IMAGE; }
  struct module_s *mod = calloc(1, sizeof *mod);
  mod->so = so; mod->generation = current->generation;
  n_modules_live++;
  *m = mod; return OK;
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  CUresult r = need_ctx(); if (r) return r;
  char sym[300];
  snprintf(sym, sizeof sym, "tgc_entry_%s", name);
  void *entry = dlsym(m->so, sym), *launch = dlsym(m->so, "tgc_launch");
  if (!entry || !launch) return NOT_FOUND;
  struct func_s *fn = calloc(1, sizeof *fn);
  fn->module = m; fn->entry = (void (*)(void **))entry;
  fn->launch = (launch_fn)launch;
  fn->max_dynamic_shared = 49152;
  snprintf(fn->name, sizeof fn->name, "%s", name);
  *f = fn; return OK;
}
CUresult cuModuleUnload(CUmodule m) {
  if (current == NULL) { n_unload_without_ctx++; return INVALID_CONTEXT; }
  n_modules_live--;
  (void)m;  /* the host library stays loaded: functions of it may still be referenced */
  return OK;
}
CUresult cuFuncSetAttribute(CUfunction f, int attr, int v) {
  CUresult r = need_ctx(); if (r) return r;
  if (f == NULL) return INVALID_HANDLE;
  if (attr != 8) return INVALID_VALUE;  /* only CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
  if (v < 0 || v > shared_opt_in()) return INVALID_VALUE;
  f->max_dynamic_shared = v; last_dynamic_shared_set = v;
  return OK;
}
/* the global `name` of a module: a variable of its host build (its size: 4 bytes, the only globals tgc declares) */
CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule m, const char *name) {
  CUresult r = need_ctx(); if (r) return r;
  if (m == NULL || name == NULL) return INVALID_VALUE;
  void *p = dlsym(m->so, name);
  if (!p) return NOT_FOUND;
  if (dptr) *dptr = (CUdeviceptr)(uintptr_t)p;
  if (bytes) *bytes = 4;
  return OK;
}
CUresult cuFuncGetAttribute(int *v, int attr, CUfunction f) {
  (void)f;
  *v = attr == 0 ? 1024 : 0;  /* CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK */
  return OK;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, CUstream stream, void **params, void **extra) {
  (void)stream; (void)extra;
  CUresult r = need_ctx(); if (r) return r;
  if (f == NULL) return INVALID_HANDLE;
  if (f->module->generation != current->generation) return INVALID_HANDLE;  /* a module of a reset context */
  if (!gx || !gy || !gz || !bx || !by || !bz) return INVALID_VALUE;
  if ((unsigned long long)bx * by * bz > 1024 || bz > 64 || gy > 65535 || gz > 65535 || gx > 2147483647u)
    return INVALID_VALUE;
  if ((int)shmem > f->max_dynamic_shared) return INVALID_VALUE;  /* past 48 KiB only after cuFuncSetAttribute */
  const char *fault = getenv("TGC_STANDIN_FAULT");
  if (fault && strcmp(fault, f->name) == 0) { current->sticky = ILLEGAL_ADDRESS; return OK; }  /* reported later */
  unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
  pthread_mutex_lock(&launch_lock);
  install_fault_handler();
  running_kernel = f->name;
  int rc = f->launch(f->entry, g, b, params, shmem);
  running_kernel = NULL;
  n_launches++;
  pthread_mutex_unlock(&launch_lock);
  return rc ? LAUNCH_OUT_OF_RESOURCES : OK;
}

/* CUDA_KERNEL_NODE_PARAMS (v2, CUDA 12.0+) */
typedef struct {
  CUfunction func; unsigned gx, gy, gz, bx, by, bz, shmem; void **kernelParams; void **extra; void *kern; CUcontext ctx;
} kernel_node;
struct graph_s { size_t n, cap; kernel_node *nodes; int generation; };
static long n_graph_launches = 0;

CUresult cuGraphCreate(CUgraph *g, unsigned flags) {
  if (flags) return INVALID_VALUE;
  CUresult r = need_ctx(); if (r) return r;
  *g = calloc(1, sizeof(struct graph_s)); (*g)->generation = current->generation; return OK;
}
CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                 const kernel_node *p) {
  CUresult r = need_ctx(); if (r) return r;
  if (g == NULL || p == NULL || node == NULL || p->func == NULL || (ndeps && deps == NULL)) return INVALID_VALUE;
  for (size_t i = 0; i < ndeps; i++)
    if ((size_t)deps[i] == 0 || (size_t)deps[i] > g->n) return INVALID_VALUE;  /* not a node of this graph */
  if (g->n == g->cap) {
    g->cap = g->cap ? 2 * g->cap : 8;
    g->nodes = realloc(g->nodes, g->cap * sizeof(kernel_node));
  }
  g->nodes[g->n++] = *p;
  *node = (CUgraphNode)(size_t)g->n;
  return OK;
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
  (void)flags; CUresult r = need_ctx(); if (r) return r;
  if (g == NULL) return INVALID_VALUE;
  struct graph_s *x = calloc(1, sizeof(struct graph_s));
  x->n = x->cap = g->n; x->generation = current->generation;
  x->nodes = malloc((g->n ? g->n : 1) * sizeof(kernel_node));
  memcpy(x->nodes, g->nodes, g->n * sizeof(kernel_node));
  *e = x; return OK;
}
CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
  CUresult r = need_ctx(); if (r) return r;
  if (e == NULL || e->generation != current->generation) return INVALID_HANDLE;  /* a graph of a reset context */
  n_graph_launches++;
  for (size_t i = 0; i < e->n; i++) {
    kernel_node *k = &e->nodes[i];
    r = cuLaunchKernel(k->func, k->gx, k->gy, k->gz, k->bx, k->by, k->bz, k->shmem, s, k->kernelParams, k->extra);
    if (r) return r;
  }
  return OK;
}
static void graph_free(struct graph_s *g) { if (g) { free(g->nodes); free(g); } }
CUresult cuGraphExecDestroy(CUgraphExec e) { graph_free(e); return OK; }
CUresult cuGraphDestroy(CUgraph g) { graph_free(g); return OK; }
long tgc_standin_graph_launches(void) { return n_graph_launches; }

CUresult cuEventCreate(CUevent *e, unsigned flags) {
  (void)flags; CUresult r = need_ctx(); if (r) return r;
  *e = calloc(1, sizeof(struct event_s)); return OK;
}
CUresult cuEventRecord(CUevent e, CUstream s) { (void)s; CUresult r = need_ctx(); if (r) return r; e->t = now(); return OK; }
CUresult cuEventSynchronize(CUevent e) { (void)e; return need_ctx(); }
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
  CUresult r = need_ctx(); if (r) return r;
  *ms = (float)((b->t - a->t) * 1e3); return OK;
}
CUresult cuEventDestroy_v2(CUevent e) { free(e); return OK; }

static const char *error_name(CUresult r) {
  switch (r) {
    case OK: return "CUDA_SUCCESS";
    case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
    case INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case LAUNCH_OUT_OF_RESOURCES: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
    default: return NULL;
  }
}
CUresult cuGetErrorName(CUresult r, const char **s) { *s = error_name(r); return *s ? OK : INVALID_VALUE; }
CUresult cuGetErrorString(CUresult r, const char **s) { *s = error_name(r); return *s ? OK : INVALID_VALUE; }

/* counters for tests, read through ctypes: live modules, unloads without a current context, launches, resets */
void tgc_standin_stats(long *out) {
  out[0] = n_modules_live; out[1] = n_unload_without_ctx; out[2] = n_launches; out[3] = n_resets;
}
long tgc_standin_dynamic_shared_set(void) { return last_dynamic_shared_set; }

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);

struct entry { const char *name; void *fn; int max_version; };
static const struct entry table[] = {
  {"cuInit", (void *)cuInit, 0}, {"cuDriverGetVersion", (void *)cuDriverGetVersion, 0},
  {"cuDeviceGetCount", (void *)cuDeviceGetCount, 0}, {"cuDeviceGet", (void *)cuDeviceGet, 0},
  {"cuDeviceGetName", (void *)cuDeviceGetName, 0}, {"cuDeviceTotalMem", (void *)cuDeviceTotalMem_v2, 0},
  {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute, 0},
  {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain, 0},
  {"cuDevicePrimaryCtxRelease", (void *)cuDevicePrimaryCtxRelease_v2, 0},
  {"cuDevicePrimaryCtxReset", (void *)cuDevicePrimaryCtxReset_v2, 0},
  {"cuCtxSetCurrent", (void *)cuCtxSetCurrent, 0}, {"cuCtxGetCurrent", (void *)cuCtxGetCurrent, 0},
  {"cuCtxPushCurrent", (void *)cuCtxPushCurrent_v2, 0}, {"cuCtxPopCurrent", (void *)cuCtxPopCurrent_v2, 0},
  {"cuCtxSynchronize", (void *)cuCtxSynchronize, 12999},  /* the 13.0 cuCtxSynchronize_v2 takes a context */
  {"cuMemAlloc", (void *)cuMemAlloc_v2, 0}, {"cuMemFree", (void *)cuMemFree_v2, 0},
  {"cuMemcpyHtoD", (void *)cuMemcpyHtoD_v2, 0}, {"cuMemcpyDtoH", (void *)cuMemcpyDtoH_v2, 0},
  {"cuModuleLoadData", (void *)cuModuleLoadData, 0}, {"cuModuleGetFunction", (void *)cuModuleGetFunction, 0},
  {"cuModuleUnload", (void *)cuModuleUnload, 0}, {"cuFuncGetAttribute", (void *)cuFuncGetAttribute, 0},
  {"cuFuncSetAttribute", (void *)cuFuncSetAttribute, 0}, {"cuModuleGetGlobal", (void *)cuModuleGetGlobal_v2, 0},
  {"cuLaunchKernel", (void *)cuLaunchKernel, 0},
  {"cuGraphCreate", (void *)cuGraphCreate, 0}, {"cuGraphAddKernelNode", (void *)cuGraphAddKernelNode_v2, 0},
  {"cuGraphInstantiateWithFlags", (void *)cuGraphInstantiateWithFlags, 0},
  {"cuGraphLaunch", (void *)cuGraphLaunch, 0}, {"cuGraphExecDestroy", (void *)cuGraphExecDestroy, 0},
  {"cuGraphDestroy", (void *)cuGraphDestroy, 0},
  {"cuEventCreate", (void *)cuEventCreate, 0}, {"cuEventRecord", (void *)cuEventRecord, 0},
  {"cuEventSynchronize", (void *)cuEventSynchronize, 0}, {"cuEventElapsedTime", (void *)cuEventElapsedTime_v2, 0},
  {"cuEventDestroy", (void *)cuEventDestroy_v2, 0},
  {"cuGetErrorName", (void *)cuGetErrorName, 0}, {"cuGetErrorString", (void *)cuGetErrorString, 0},
  {"cuGetProcAddress", (void *)cuGetProcAddress_v2, 0},
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
  (void)flags;
  for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
    if (strcmp(table[i].name, symbol) == 0 && (table[i].max_version == 0 || version <= table[i].max_version)) {
      *pfn = table[i].fn;
      if (status) *status = 0;
      return OK;
    }
  }
  *pfn = NULL;
  if (status) *status = 1;  /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
  return NOT_FOUND;
}

CUresult cuGetExportTable(const void **table_out, const void *id) { (void)id; *table_out = NULL; return NOT_FOUND; }
