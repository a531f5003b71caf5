/* Scalar bf16 <-> float32 conversions shared by the C kernels (paged_attn.c, rms_norm.c).
 *
 * Why one header: both kernels must round exactly as torch does, so the rounding lives in one place. The build
 * (seer/models/attn_kernel.py build_library) compiles with this directory on the include path and puts every
 * header of it in the library's cache key.
 */
#ifndef SEER_BF16_H
#define SEER_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = ((uint32_t)x) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even, like torch */
    return (uint16_t)(u >> 16);
}

#endif
