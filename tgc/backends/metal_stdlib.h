// tgc's stub <metal_stdlib>: just enough of the Metal Shading Language for clang to type-check the kernels
// tgc renders, parsed as C++17 (`-x c++ -std=c++17 -nostdinc`). It is NOT Apple's header and never runs
// anything: the real one exists only on macOS. tgc.backends.metal maps it in as <metal_stdlib>.
//
// Keep it in step with MetalRenderer (tgc/backends/cstyle.py): every type, qualifier and function the
// renderer emits must be declared here, with Metal's signatures, so that a wrong argument type is an error.
// What it maps:
//   - address spaces `device`, `constant`, `threadgroup` -> clang address spaces (so a pointer into one
//     space does not silently convert to another); `constant` also adds `const` (it is read-only in Metal);
//     `threadgroup` also adds `static`, for kernel-scope arrays (so it does not fit a parameter);
//     `thread` is the default space; `kernel` is dropped;
//   - `half` -> `_Float16`, `uchar`/`ushort`/`uint`/`ulong`, and the vector types (`uint3`, `float4`, ...)
//     -> `ext_vector_type`, which has `.x/.y/.z/.w` like Metal's vectors;
//   - the `metal::` functions the renderer calls, for float and half scalars (integer min/max/abs/clamp for
//     every integer type), `as_type<T>` (same size, checked), `INFINITY`, `NAN`;
//   - `double` is poisoned: Metal has no 64-bit float.
// `[[buffer(n)]]`, `[[threadgroup_position_in_grid]]` and the other Metal attributes are unknown to clang,
// which ignores them with a warning; tgc checks their names against Metal's list.

#ifndef TGC_METAL_STDLIB_STUB
#define TGC_METAL_STDLIB_STUB

// ---- address spaces and function qualifiers
#define kernel
#define device __attribute__((address_space(1)))
#define constant const __attribute__((address_space(2)))
// `threadgroup` arrays are declared inside kernels, which clang allows only for statics in an address space
#define threadgroup static __attribute__((address_space(3)))
#define thread

// ---- scalar types
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;  // 64-bit on the target tgc parses for (arm64-apple-macos), as in Metal
typedef _Float16 half;

static_assert(sizeof(long) == 8 && sizeof(ulong) == 8, "Metal's long is 64-bit");
static_assert(sizeof(half) == 2, "Metal's half is 16-bit");

// ---- vector types: T2, T3, T4 for every scalar type
#define TGC_VECTORS(T)                                  \
  typedef T T##2 __attribute__((ext_vector_type(2)));   \
  typedef T T##3 __attribute__((ext_vector_type(3)));   \
  typedef T T##4 __attribute__((ext_vector_type(4)));
TGC_VECTORS(bool)
TGC_VECTORS(char)
TGC_VECTORS(uchar)
TGC_VECTORS(short)
TGC_VECTORS(ushort)
TGC_VECTORS(int)
TGC_VECTORS(uint)
TGC_VECTORS(long)
TGC_VECTORS(ulong)
TGC_VECTORS(half)
TGC_VECTORS(float)
#undef TGC_VECTORS

// ---- constants
#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define HUGE_VALF __builtin_huge_valf()
#define MAXFLOAT 0x1.fffffep+127f
#define FLT_MAX 0x1.fffffep+127f
#define FLT_MIN 0x1p-126f
#define HALF_MAX ((half)65504.0f)

namespace metal {

// ---- a few type traits (no <type_traits> here: the parse is -nostdinc)
template <bool B, class T = void> struct enable_if {};
template <class T> struct enable_if<true, T> { typedef T type; };
template <class T> struct is_scalar_int { static constexpr bool value = __is_integral(T) && !__is_same(T, bool); };
template <class T> struct is_scalar_float { static constexpr bool value = __is_same(T, float) || __is_same(T, half); };

// ---- float math, for float and half (Metal declares each for both; an int argument is ambiguous, as there)
#define TGC_UNARY(name)          \
  float name(float x);           \
  half name(half x);
#define TGC_BINARY(name)         \
  float name(float x, float y);  \
  half name(half x, half y);
#define TGC_TERNARY(name)                 \
  float name(float x, float y, float z);  \
  half name(half x, half y, half z);
#define TGC_PREDICATE(name)      \
  bool name(float x);            \
  bool name(half x);

TGC_UNARY(exp) TGC_UNARY(exp2) TGC_UNARY(exp10) TGC_UNARY(log) TGC_UNARY(log2) TGC_UNARY(log10)
TGC_UNARY(sin) TGC_UNARY(cos) TGC_UNARY(tan) TGC_UNARY(asin) TGC_UNARY(acos) TGC_UNARY(atan)
TGC_UNARY(sinh) TGC_UNARY(cosh) TGC_UNARY(tanh) TGC_UNARY(sqrt) TGC_UNARY(rsqrt) TGC_UNARY(cbrt)
TGC_UNARY(trunc) TGC_UNARY(floor) TGC_UNARY(ceil) TGC_UNARY(round) TGC_UNARY(rint) TGC_UNARY(fabs)
TGC_UNARY(sign) TGC_UNARY(fract) TGC_UNARY(saturate) TGC_UNARY(erf)
TGC_BINARY(fmax) TGC_BINARY(fmin) TGC_BINARY(pow) TGC_BINARY(powr) TGC_BINARY(fmod) TGC_BINARY(atan2)
TGC_BINARY(copysign) TGC_BINARY(step)
TGC_TERNARY(fma) TGC_TERNARY(mix)
TGC_PREDICATE(isnan) TGC_PREDICATE(isinf) TGC_PREDICATE(isfinite) TGC_PREDICATE(signbit)

#undef TGC_UNARY
#undef TGC_BINARY
#undef TGC_TERNARY
#undef TGC_PREDICATE

// ---- min, max, abs, clamp: one type for all arguments (mixing types does not deduce, as in Metal)
template <class T, class = typename enable_if<is_scalar_int<T>::value || is_scalar_float<T>::value>::type>
T max(T x, T y);
template <class T, class = typename enable_if<is_scalar_int<T>::value || is_scalar_float<T>::value>::type>
T min(T x, T y);
template <class T, class = typename enable_if<is_scalar_int<T>::value || is_scalar_float<T>::value>::type>
T clamp(T x, T lo, T hi);
template <class T, class = typename enable_if<is_scalar_int<T>::value || is_scalar_float<T>::value>::type>
T abs(T x);

// ---- select(a, b, c): c ? b : a
template <class T> T select(T a, T b, bool c);

// ---- reinterpret the bits of a value as another type of the same size
template <class T, class F>
inline T as_type(F x) {
  static_assert(sizeof(T) == sizeof(F), "as_type: the source and destination types differ in size");
  T y;
  __builtin_memcpy(&y, &x, sizeof(T));  // not __builtin_bit_cast: one error for a size mismatch, not two
  return y;
}

// ---- barriers
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
void threadgroup_barrier(mem_flags flags);
void simdgroup_barrier(mem_flags flags);

// ---- SIMD-group reductions
template <class T> T simd_sum(T x);
template <class T> T simd_max(T x);
template <class T> T simd_min(T x);
template <class T> T simd_shuffle_down(T x, ushort delta);
template <class T> T simd_shuffle_xor(T x, ushort mask);

// ---- fast:: and precise:: variants of the float math
namespace fast {
float exp(float x); float exp2(float x); float log(float x); float log2(float x); float sin(float x);
float cos(float x); float sqrt(float x); float rsqrt(float x); float tanh(float x); float pow(float x, float y);
}  // namespace fast
namespace precise {
float exp(float x); float exp2(float x); float log(float x); float log2(float x); float sin(float x);
float cos(float x); float sqrt(float x); float rsqrt(float x); float tanh(float x); float pow(float x, float y);
}  // namespace precise

}  // namespace metal

// Metal has no 64-bit float: any later use of `double` is an error.
#pragma clang poison double

#endif  // TGC_METAL_STDLIB_STUB
