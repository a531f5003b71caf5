/* Fused RMSNorm for bf16 or float32 rows on CPU: out = w * cast(x * rsqrt(mean(x^2) + eps)).
 *
 * Why: the PyTorch formula (seer/models/layers.py RMSNorm: to float, pow, mean, add, rsqrt, mul, to bf16, mul by
 * the weight) is ~8 small ops, each a pass over the activations plus dispatch overhead; a decode step runs 61 of
 * them. This is one pass per row with the same arithmetic: squares summed in float32 (only the summation order
 * differs), the mean, r = 1 / sqrt(mean + eps) (torch's float rsqrt is that division too), x * r rounded to bf16
 * (round to nearest even), then times the bf16 weight in float32, rounded to bf16 again, like torch's bf16 mul.
 * The float32 version is the same arithmetic without the bf16 roundings: out = w * (x * r).
 * Built and loaded by seer/models/rms_norm.py through attn_kernel.build_library.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#ifdef __AVX512F__
/* 32 bf16 as one vector of dwords: the even elements are the low halves, the odd ones the high halves. Their
 * float32 values: even = dword << 16, odd = dword & 0xffff0000; no shuffles needed. */
static inline __m512 even_f32(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
static inline __m512 odd_f32(__m512i v) { return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u))); }

/* f rounded to bf16 (nearest even, like torch), kept in the high half of each dword (low half zero): that is
 * also the float32 value of the bf16 result. NaNs produced by float arithmetic are quiet with their payload in
 * the high bits, so they stay NaN. */
static inline __m512i round_hi(__m512 f) {
    const __m512i u = _mm512_castps_si512(f);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    return _mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u));
}
#endif

/* wf: the weight as float32, even elements then odd ones of each 32-element chunk (see norm_row) for the
 * vector part, plain order for the tail. */
static void norm_row(const uint16_t *x, const float *wf, uint16_t *out, int64_t dim, float eps) {
    int64_t d = 0;
    float ss = 0.f;
#ifdef __AVX512F__
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; d + 32 <= dim; d += 32) {
        const __m512i v = _mm512_loadu_si512((const void *)(x + d));
        acc0 = _mm512_fmadd_ps(even_f32(v), even_f32(v), acc0);
        acc1 = _mm512_fmadd_ps(odd_f32(v), odd_f32(v), acc1);
    }
    ss = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#endif
    for (; d < dim; ++d) ss += bf16_to_f32(x[d]) * bf16_to_f32(x[d]);
    const float r = 1.f / sqrtf(ss / (float)dim + eps);
    d = 0;
#ifdef __AVX512F__
    const __m512 rv = _mm512_set1_ps(r);
    for (; d + 32 <= dim; d += 32) {
        const __m512i v = _mm512_loadu_si512((const void *)(x + d));
        const __m512 he = _mm512_castsi512_ps(round_hi(_mm512_mul_ps(even_f32(v), rv)));
        const __m512 ho = _mm512_castsi512_ps(round_hi(_mm512_mul_ps(odd_f32(v), rv)));
        const __m512i oe = round_hi(_mm512_mul_ps(_mm512_loadu_ps(wf + d), he));
        const __m512i oo = round_hi(_mm512_mul_ps(_mm512_loadu_ps(wf + d + 16), ho));
        _mm512_storeu_si512((void *)(out + d), _mm512_or_si512(_mm512_srli_epi32(oe, 16), oo));
    }
#endif
    for (; d < dim; ++d) out[d] = f32_to_bf16(wf[d] * bf16_to_f32(f32_to_bf16(bf16_to_f32(x[d]) * r)));
}

/* x, out: [rows, dim] bf16 (contiguous), w: [dim] bf16. Rows are split over threads for large inputs only:
 * below ~64K elements a parallel region costs more than it saves. Returns 1 when out of memory, else 0. */
int seer_rms_norm_bf16(const uint16_t *x, const uint16_t *w, uint16_t *out, int64_t rows, int64_t dim, float eps,
                       int num_threads) {
    float stack_wf[1024], *wf = dim <= 1024 ? stack_wf : (float *)malloc((size_t)dim * sizeof(float));
    if (!wf) return 1;
    int64_t d = 0;
#ifdef __AVX512F__
    for (; d + 32 <= dim; d += 32)
        for (int k = 0; k < 16; ++k) wf[d + k] = bf16_to_f32(w[d + 2 * k]), wf[d + 16 + k] = bf16_to_f32(w[d + 2 * k + 1]);
#endif
    for (; d < dim; ++d) wf[d] = bf16_to_f32(w[d]);
    if (rows * dim < (1 << 16) || num_threads <= 1) {
        for (int64_t i = 0; i < rows; ++i) norm_row(x + i * dim, wf, out + i * dim, dim, eps);
    } else {
#pragma omp parallel for num_threads(num_threads) schedule(static)
        for (int64_t i = 0; i < rows; ++i) norm_row(x + i * dim, wf, out + i * dim, dim, eps);
    }
    if (wf != stack_wf) free(wf);
    return 0;
}

/* Sum of squares of a float32 row: vector partial sums (gcc keeps a float reduction scalar without -ffast-math). */
static float sum_squares_f32(const float *x, int64_t dim) {
    int64_t d = 0;
    float ss = 0.f;
#if defined(__AVX512F__)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; d + 32 <= dim; d += 32) {
        const __m512 a = _mm512_loadu_ps(x + d), b = _mm512_loadu_ps(x + d + 16);
        acc0 = _mm512_fmadd_ps(a, a, acc0);
        acc1 = _mm512_fmadd_ps(b, b, acc1);
    }
    ss = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; d + 16 <= dim; d += 16) {
        const __m256 a = _mm256_loadu_ps(x + d), b = _mm256_loadu_ps(x + d + 8);
        acc0 = _mm256_fmadd_ps(a, a, acc0);
        acc1 = _mm256_fmadd_ps(b, b, acc1);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(acc0, acc1));
    for (int k = 0; k < 8; ++k) ss += lanes[k];
#endif
    for (; d < dim; ++d) ss += x[d] * x[d];
    return ss;
}

static void norm_row_f32(const float *x, const float *w, float *out, int64_t dim, float eps) {
    const float r = 1.f / sqrtf(sum_squares_f32(x, dim) / (float)dim + eps);
    for (int64_t d = 0; d < dim; ++d) out[d] = w[d] * (x[d] * r);  /* two roundings, as torch's two muls */
}

/* x, out: [rows, dim] float32 (contiguous), w: [dim] float32; threads as in seer_rms_norm_bf16. Returns 0. */
int seer_rms_norm_f32(const float *x, const float *w, float *out, int64_t rows, int64_t dim, float eps,
                      int num_threads) {
    if (rows * dim < (1 << 16) || num_threads <= 1) {
        for (int64_t i = 0; i < rows; ++i) norm_row_f32(x + i * dim, w, out + i * dim, dim, eps);
    } else {
#pragma omp parallel for num_threads(num_threads) schedule(static)
        for (int64_t i = 0; i < rows; ++i) norm_row_f32(x + i * dim, w, out + i * dim, dim, eps);
    }
    return 0;
}
