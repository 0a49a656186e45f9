// Element types and their host-side conversions.
//
//   sg::DType t = sg::DType::kBF16;                // SizeOf(t) == 2, DTypeName(t) == "bf16"
//   sg::BFloat16 b = sg::BFloat16::FromFloat(1.5f); // round-to-nearest-even
//   float f = b.ToFloat();
#ifndef SGTRAIN_KERNELS_CORE_DTYPE_H_
#define SGTRAIN_KERNELS_CORE_DTYPE_H_

#include <cstdint>
#include <cstring>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace sg {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64 };

// Bytes per element.
constexpr int64_t SizeOf(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

// Short lower-case name: "f32", "bf16", "f16", "i32", "i64".
absl::string_view DTypeName(DType t);

// Parses DTypeName's output (also accepts "float32", "bfloat16", "float16", "int32", "int64").
absl::StatusOr<DType> ParseDType(absl::string_view name);

constexpr bool IsFloating(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

// bfloat16 on the host: the top 16 bits of an IEEE float. Same layout as CUDA's __nv_bfloat16.
struct BFloat16 {
  uint16_t bits;

  static BFloat16 FromFloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return BFloat16{uint16_t(u >> 16)};
  }
  float ToFloat() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// IEEE half on the host. Same layout as CUDA's __half.
struct Half {
  uint16_t bits;
  static Half FromFloat(float f);  // round to nearest even, overflow to inf
  float ToFloat() const;
};

static_assert(sizeof(BFloat16) == 2 && sizeof(Half) == 2, "16-bit types must be 2 bytes");

// The DType of a C++ element type, for templates: DTypeOf<float>() == DType::kF32.
template <typename T> constexpr DType DTypeOf();
template <> constexpr DType DTypeOf<float>() { return DType::kF32; }
template <> constexpr DType DTypeOf<BFloat16>() { return DType::kBF16; }
template <> constexpr DType DTypeOf<Half>() { return DType::kF16; }
template <> constexpr DType DTypeOf<int32_t>() { return DType::kI32; }
template <> constexpr DType DTypeOf<int64_t>() { return DType::kI64; }

// Element <-> float, for CPU reference code written once for every floating type.
inline float ToFloat(float v) { return v; }
inline float ToFloat(BFloat16 v) { return v.ToFloat(); }
inline float ToFloat(Half v) { return v.ToFloat(); }
template <typename T> T FromFloat(float v);
template <> inline float FromFloat<float>(float v) { return v; }
template <> inline BFloat16 FromFloat<BFloat16>(float v) { return BFloat16::FromFloat(v); }
template <> inline Half FromFloat<Half>(float v) { return Half::FromFloat(v); }

}  // namespace sg

#endif  // SGTRAIN_KERNELS_CORE_DTYPE_H_
