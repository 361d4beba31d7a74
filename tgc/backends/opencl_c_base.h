/* tgc's stub of clang's <opencl-c-base.h>, for type-checking rendered OpenCL C with libclang where no OpenCL
   compiler runs (pip's libclang ships no OpenCL headers). The builtin functions themselves are declared by
   clang (-fdeclare-opencl-builtins), with every overload of the OpenCL C 1.2 specification; this file gives
   only the types and macros those declarations and the kernels use, as the real header defines them. */
#ifndef TGC_OPENCL_C_BASE_H
#define TGC_OPENCL_C_BASE_H

/* named (global, local, private) address-space overloads of builtins such as vload_half, as in OpenCL C 1.2 */
#define __opencl_c_named_address_space_builtins 1

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef __SIZE_TYPE__ size_t;
typedef __PTRDIFF_TYPE__ ptrdiff_t;
typedef __INTPTR_TYPE__ intptr_t;
typedef __UINTPTR_TYPE__ uintptr_t;

#define TGC_VEC(T) \
  typedef T T##2 __attribute__((ext_vector_type(2))); typedef T T##3 __attribute__((ext_vector_type(3))); \
  typedef T T##4 __attribute__((ext_vector_type(4))); typedef T T##8 __attribute__((ext_vector_type(8))); \
  typedef T T##16 __attribute__((ext_vector_type(16)));
TGC_VEC(char) TGC_VEC(uchar) TGC_VEC(short) TGC_VEC(ushort) TGC_VEC(int) TGC_VEC(uint) TGC_VEC(long)
TGC_VEC(ulong) TGC_VEC(float) TGC_VEC(half) TGC_VEC(double)
#undef TGC_VEC

#define CLK_LOCAL_MEM_FENCE 0x01
#define CLK_GLOBAL_MEM_FENCE 0x02
typedef uint cl_mem_fence_flags;

#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define HUGE_VALF __builtin_huge_valf()
#define MAXFLOAT 0x1.fffffep127f
#define FLT_MAX 0x1.fffffep127f
#define FLT_MIN 0x1.0p-126f
#define DBL_MAX 0x1.fffffffffffffp1023
#define CHAR_BIT 8
#define INT_MAX 2147483647
#define INT_MIN (-2147483647 - 1)
#define UINT_MAX 0xffffffff
#define LONG_MAX 0x7fffffffffffffffL
#define LONG_MIN (-0x7fffffffffffffffL - 1)
#define ULONG_MAX 0xffffffffffffffffUL

/* reinterpreting casts: macros over __builtin_astype in the real header */
#define as_char(x) __builtin_astype((x), char)
#define as_uchar(x) __builtin_astype((x), uchar)
#define as_short(x) __builtin_astype((x), short)
#define as_ushort(x) __builtin_astype((x), ushort)
#define as_int(x) __builtin_astype((x), int)
#define as_uint(x) __builtin_astype((x), uint)
#define as_long(x) __builtin_astype((x), long)
#define as_ulong(x) __builtin_astype((x), ulong)
#define as_float(x) __builtin_astype((x), float)
#define as_double(x) __builtin_astype((x), double)
#define as_half(x) __builtin_astype((x), half)

#endif
