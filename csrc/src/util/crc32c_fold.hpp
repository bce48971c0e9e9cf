#pragma once
// The arithmetic behind the carry-less-multiply CRC32C kernels (crc32c_x86.cpp,
// crc32c_arm.cpp): folding constants, derived here at compile time from the polynomial, so no
// number in the kernels is typed in by hand. tests/cpp/test_crc32c.cpp recomputes them by an
// independent method (long division in the non-reflected form) and checks each fold against the
// table CRC.
//
// The reflected form. CRC32C processes each byte least significant bit first, so the first
// message bit is the highest power of x. A 128-bit chunk loaded little-endian into a vector
// register therefore holds bit j as the coefficient of x^(127-j): its low 64-bit half H is the
// high-order part, its high half L the low-order part, chunk = H*x^64 + L.
//
// Folding. The CRC register after a message M (from state 0) is M*x^32 mod P, and a chunk X
// that starts D bits before a later chunk T contributes X*x^D at T's position. So X can be
// replaced, modulo P, by H*(x^(D+64) mod P) + L*(x^D mod P), a value of under 128 bits that is
// XORed into T: two carry-less multiplies per 128 bits, with no dependency on the bytes between.
//
// The constants' form. A carry-less multiply of the reflected 64-bit H by a 32-bit constant
// holding k reflected (bit i = coefficient of x^(31-i)) yields H*k*x^33 in the reflected
// 128-bit layout. Hence the constant for H is x^(D+64-33) = x^(D+31) mod P and the one for L is
// x^(D-33) mod P, each fitting the low 32 bits of a 64-bit lane (D >= 128 here, so D-33 > 0).
//
// The last 128 bits are reduced to the 32-bit register with two 64-bit CRC32C instructions from
// state 0 (x86 SSE4.2 crc32, ARMv8 crc32cx): the register after those 16 bytes is exactly
// chunk*x^32 mod P. The caller's starting state is XORed into the first 32 message bits, which
// the definition makes equivalent to starting from it.

#include <cstddef>
#include <cstdint>

namespace kvtier::detail::crc32c_fold {

/// The Castagnoli polynomial 0x1EDC6F41, bit-reflected (its x^32 term implied).
inline constexpr std::uint32_t kPolynomial = 0x82F63B78u;

/// x^n mod P in the reflected form: bit i is the coefficient of x^(31-i).
constexpr std::uint32_t x_pow_mod(std::size_t n) {
  std::uint32_t r = 0x80000000u;  // x^0
  // Multiplying by x moves every coefficient one bit to the right; an x^31 term (bit 0)
  // becomes x^32, which is congruent to the polynomial's other terms.
  for (std::size_t i = 0; i < n; ++i) r = (r & 1u) ? (r >> 1) ^ kPolynomial : r >> 1;
  return r;
}

/// The constants that fold a 128-bit chunk onto the one `distance_bytes` later: `high_half`
/// multiplies the low 64 bits of the register (the chunk's high-order half), `low_half` the
/// high 64 bits.
struct FoldConstants {
  std::uint64_t high_half;
  std::uint64_t low_half;
};

constexpr FoldConstants fold_by(std::size_t distance_bytes) {
  return {x_pow_mod(8 * distance_bytes + 31), x_pow_mod(8 * distance_bytes - 33)};
}

/// fold_by(kDistanceBytes) as a constant: a variable template's initializer is evaluated by the
/// compiler, so no kernel runs x_pow_mod's loop (thousands of steps) at run time.
template <std::size_t kDistanceBytes>
inline constexpr FoldConstants kFoldBy = fold_by(kDistanceBytes);

/// The constants that fold register i of kCount, each kStepBytes wide, onto the last one
/// ((kCount - 1 - i) * kStepBytes ahead), as a constant table; the last entry is unused.
template <std::size_t kCount, std::size_t kStepBytes>
struct OntoLast {
  FoldConstants by_register[kCount];
  constexpr OntoLast() : by_register{} {
    for (std::size_t i = 0; i + 1 < kCount; ++i)
      by_register[i] = fold_by((kCount - 1 - i) * kStepBytes);
  }
};
template <std::size_t kCount, std::size_t kStepBytes>
inline constexpr OntoLast<kCount, kStepBytes> kOntoLast{};

}  // namespace kvtier::detail::crc32c_fold
