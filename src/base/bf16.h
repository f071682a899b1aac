/* bf16.h — bfloat16 bit patterns: the upper 16 bits of an IEEE binary32.
 * Shared by the weight store (core/weight_store.c), its kernels and the
 * file writer. */
#ifndef MHA_BASE_BF16_H
#define MHA_BASE_BF16_H

#include <stdint.h>
#include <string.h>

static inline float mha_bf16_bits_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f rounded to bfloat16, to nearest, ties to even (f finite; a value at
 * or above 0x1.ffp127 + half an ulp becomes Inf: callers check). Adding
 * 0x7fff plus the kept lowest bit carries into bit 16 exactly when the
 * dropped half is above one half, or equal to it with an odd kept part. */
static inline uint16_t mha_bf16_round_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The largest float that rounds to a finite bf16 value: 0x1.ffp127
 * (halfway to the next power of two) and above round to infinity. */
#define MHA_BF16_ROUNDS_FINITE 0x1.fefffep127f

/* f rounded to bf16 and widened back (the value a bf16 operand holds). */
static inline float mha_bf16_round(float f) { return mha_bf16_bits_to_float(mha_bf16_round_bits(f)); }

/* dst (n) = src (n) rounded to bf16 (dst may be src): the operands of a
 * bf16 product (options.bf16_matmul) where no AMX packing rounds them. */
static inline void mha_bf16_round_array(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = mha_bf16_round(src[i]);
}

#endif /* MHA_BASE_BF16_H */
