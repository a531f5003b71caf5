/* Paged attention for short queries (decode, speculative verify) on CPU.
 *
 * Why C: in pure PyTorch a decode step must first gather every sequence's KV blocks into a padded dense tensor
 * and then run SDPA on it, touching the cache three times with poorly shaped kernels (q_len 1); at 256
 * sequences x 300 tokens that is ~10x the memory-bandwidth floor. This kernel reads each cached K/V row once,
 * straight from the block table. seer/models/attn_kernel.py compiles it on first use (cc -O3 -march=native
 * -fopenmp) and falls back to the PyTorch path when no compiler is available.
 *
 * Two paths. bf16 with AVX512-BF16 and head_dim 32/64/128 (the engine's speed path) takes the one-pass,
 * shared-prefix-aware path of the SEER_BF16_FAST section below. Everything else (float32, other CPUs or head
 * sizes) takes the generic path: work item = one sequence; its cache rows are read whole (all kv heads,
 * contiguous within a block) in block order with software prefetch, because scattered per-head reads left the
 * loop waiting on memory latency. For each kv head, its M = q_len * G query rows (G query heads share one kv
 * head) are scored against all visible keys, softmaxed and used to weight V, all in float32.
 * Visibility (both paths): every cached key (position < ctx = seq_len - q_len) and, among the new keys, those
 * whose bit is set in allowed[token] (ancestors and self for tree verification) or, without `allowed`, keys
 * 0..j (a causal chain). AVX-512 paths are used when the compiler targets it; the portable loops are the
 * reference semantics.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SEER_AVX2 1 /* 8-wide float path for CPUs without AVX-512; the scalar loops serve everything else */
#endif

#ifdef SEER_AVX2
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float hmax256(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* [sum a, sum b, sum c, sum d] of four 8-lane vectors */
static inline __m128 hsum4x8(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* exp(x) for x <= 0, the same polynomial as exp512; -inf is clamped (callers mask it to 0). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    /* 2^n by building the exponent field: n is in [-126, 0] after the clamp, a normal float */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

typedef struct {
    const void *q;
    void *out;
    const void *k_cache, *v_cache;
    const int64_t *block_tables, *q_start, *q_len, *seq_len, *allowed;
    int64_t max_blocks, H, Hkv, D, block_size;
    float scale;
    int is_bf16;
} Args;

/* row (D elements, bf16 or f32) -> float buffer */
static inline void load_row(float *restrict dst, const void *src, int64_t D, int is_bf16) {
    if (!is_bf16) {
        memcpy(dst, src, (size_t)D * sizeof(float));
        return;
    }
    const uint16_t *s = (const uint16_t *)src;
    int64_t d = 0;
#ifdef __AVX512F__
    for (; d + 16 <= D; d += 16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(s + d));
        _mm512_storeu_ps(dst + d, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)));
    }
#elif defined(SEER_AVX2)
    for (; d + 8 <= D; d += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(s + d));
        _mm256_storeu_ps(dst + d, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)));
    }
#endif
    for (; d < D; ++d) dst[d] = bf16_to_f32(s[d]);
}

static inline float dot(const float *restrict a, const float *restrict b, int64_t D) {
    int64_t d = 0;
    float s = 0.f;
#ifdef __AVX512F__
    __m512 acc = _mm512_setzero_ps();
    for (; d + 16 <= D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
    s = _mm512_reduce_add_ps(acc);
#elif defined(SEER_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (; d + 8 <= D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    s = hsum256(acc);
#endif
    for (; d < D; ++d) s += a[d] * b[d];
    return s;
}

static inline void axpy(float *restrict y, float w, const float *restrict x, int64_t D) {
    int64_t d = 0;
#ifdef __AVX512F__
    const __m512 wv = _mm512_set1_ps(w);
    for (; d + 16 <= D; d += 16)
        _mm512_storeu_ps(y + d, _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + d), _mm512_loadu_ps(y + d)));
#elif defined(SEER_AVX2)
    const __m256 wv = _mm256_set1_ps(w);
    for (; d + 8 <= D; d += 8)
        _mm256_storeu_ps(y + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + d), _mm256_loadu_ps(y + d)));
#endif
    for (; d < D; ++d) y[d] += w * x[d];
}

#ifdef __AVX512F__
/* exp(x) for x <= 0 (softmax after max subtraction), relative error ~2e-7; -inf -> 0. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(p, n);
}
#endif

/* In place: s[0..L) <- softmax(s); masked entries are -inf; at least one entry is finite. */
static void softmax_row(float *s, int64_t L) {
    float mx = -INFINITY, sum = 0.f;
    int64_t p = 0;
#ifdef __AVX512F__
    __m512 mxv = _mm512_set1_ps(-INFINITY);
    for (; p + 16 <= L; p += 16) mxv = _mm512_max_ps(mxv, _mm512_loadu_ps(s + p));
    mx = _mm512_reduce_max_ps(mxv);
#elif defined(SEER_AVX2)
    __m256 mxv = _mm256_set1_ps(-INFINITY);
    for (; p + 8 <= L; p += 8) mxv = _mm256_max_ps(mxv, _mm256_loadu_ps(s + p));
    mx = hmax256(mxv);
#endif
    for (; p < L; ++p) mx = s[p] > mx ? s[p] : mx;
    p = 0;
#ifdef __AVX512F__
    const __m512 mv = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    for (; p + 16 <= L; p += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + p), mv));
        e = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(_mm512_loadu_ps(s + p), _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
                                 e, _mm512_setzero_ps());
        _mm512_storeu_ps(s + p, e);
        acc = _mm512_add_ps(acc, e);
    }
    sum = _mm512_reduce_add_ps(acc);
#elif defined(SEER_AVX2)
    const __m256 mv = _mm256_set1_ps(mx), ninf = _mm256_set1_ps(-INFINITY);
    __m256 acc = _mm256_setzero_ps();
    for (; p + 8 <= L; p += 8) {
        const __m256 v = _mm256_loadu_ps(s + p);
        const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(v, ninf, _CMP_EQ_OQ), exp256(_mm256_sub_ps(v, mv)));
        _mm256_storeu_ps(s + p, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = hsum256(acc);
#endif
    for (; p < L; ++p) {
        const float e = s[p] == -INFINITY ? 0.f : expf(s[p] - mx);
        s[p] = e;
        sum += e;
    }
    const float inv = 1.f / sum;
    for (p = 0; p < L; ++p) s[p] *= inv;
}

#ifdef __AVX512F__
/* Lane k of the result = sum of the 16 lanes of v[k]: 45 shuffles/adds for 16 dot products instead of 16
 * separate horizontal reductions (~130), which dominated the scoring loop. */
static inline __m512 hsum16(const __m512 *v) {
    __m512 r[8], s[4], u[2];
    for (int i = 0; i < 8; ++i) /* 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] */
        r[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; ++i) { /* 128-bit lane: [a, b, c, d] partial sums */
        const __m512d a = _mm512_castps_pd(r[2 * i]), b = _mm512_castps_pd(r[2 * i + 1]);
        s[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int i = 0; i < 2; ++i) /* [abcd, abcd, efgh, efgh] */
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
}
#endif

/* out[o] = q . rows[o * stride : + D] for o < n (q already scaled). NC = D / 16 when fixed, 0 = generic. */
static inline __attribute__((always_inline)) void score_rows(const float *q, const float *rows, int64_t stride,
                                                             int64_t n, int64_t D, float *out, const int NC) {
    int64_t o = 0;
#ifdef __AVX512F__
    if (NC > 0) {
        __m512 qv[8];
        for (int c = 0; c < NC; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
        for (; o + 16 <= n; o += 16) { /* 16 keys at a time, reduced together */
            __m512 acc[16];
            for (int t = 0; t < 16; ++t) {
                const float *k = rows + (o + t) * stride;
                acc[t] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
                for (int c = 1; c < NC; ++c) acc[t] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 16 * c), acc[t]);
            }
            _mm512_storeu_ps(out + o, hsum16(acc));
        }
        for (; o < n; ++o) {
            const float *k = rows + o * stride;
            __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
            for (int c = 1; c < NC; ++c) acc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 16 * c), acc);
            out[o] = _mm512_reduce_add_ps(acc);
        }
        return;
    }
#elif defined(SEER_AVX2)
    if (NC > 0) { /* 4 keys at a time: 2 * NC query registers and 4 accumulators fit the 16 ymm registers */
        const int C8 = 2 * NC;
        __m256 qv[16];
        for (int c = 0; c < C8; ++c) qv[c] = _mm256_loadu_ps(q + 8 * c);
        for (; o + 4 <= n; o += 4) {
            __m256 acc[4];
            for (int t = 0; t < 4; ++t) {
                const float *k = rows + (o + t) * stride;
                acc[t] = _mm256_mul_ps(qv[0], _mm256_loadu_ps(k));
                for (int c = 1; c < C8; ++c) acc[t] = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(k + 8 * c), acc[t]);
            }
            _mm_storeu_ps(out + o, hsum4x8(acc[0], acc[1], acc[2], acc[3]));
        }
    }
#endif
    for (; o < n; ++o) out[o] = dot(q, rows + o * stride, D);
}

/* acc[0:D] += sum_o w[o] * rows[o * stride : + D]. NC = D / 16 when fixed, 0 = generic. */
static inline __attribute__((always_inline)) void weighted_sum(float *acc, const float *w, const float *rows,
                                                               int64_t stride, int64_t n, int64_t D, const int NC) {
#ifdef __AVX512F__
    if (NC > 0) {
        __m512 av[8];
        for (int c = 0; c < NC; ++c) av[c] = _mm512_loadu_ps(acc + 16 * c);
        for (int64_t o = 0; o < n; ++o) {
            const __m512 wv = _mm512_set1_ps(w[o]);
            const float *v = rows + o * stride;
            for (int c = 0; c < NC; ++c) av[c] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + 16 * c), av[c]);
        }
        for (int c = 0; c < NC; ++c) _mm512_storeu_ps(acc + 16 * c, av[c]);
        return;
    }
#elif defined(SEER_AVX2)
    if (NC > 0) {
        const int C8 = 2 * NC;
        __m256 av[16];
        for (int c = 0; c < C8; ++c) av[c] = _mm256_loadu_ps(acc + 8 * c);
        for (int64_t o = 0; o < n; ++o) {
            const __m256 wv = _mm256_set1_ps(w[o]);
            const float *v = rows + o * stride;
            for (int c = 0; c < C8; ++c) av[c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + 8 * c), av[c]);
        }
        for (int c = 0; c < C8; ++c) _mm256_storeu_ps(acc + 8 * c, av[c]);
        return;
    }
#endif
    for (int64_t o = 0; o < n; ++o)
        if (w[o] != 0.f) axpy(acc, w[o], rows + o * stride, D);
}

#define PF_AHEAD 2 /* blocks */
/* The generic path reads a sequence's K blocks, then its V blocks: one stream of 2 * nblk blocks. Block i of it
 * is prefetched while block i - PF_AHEAD is in use, its lines spread over the rows computed meanwhile: the block
 * table scatters blocks over memory, so the hardware prefetchers, which follow addresses, cannot find the next
 * one, and fetching a whole block at once overflows the core's outstanding-miss slots (measured 30% slower than
 * spreading). */
static inline void prefetch_stream(const Args *a, const int64_t *bt, int64_t L, int64_t i, int64_t part,
                                   int64_t parts) {
    const int64_t bs = a->block_size, nblk = (L + bs - 1) / bs;
    if (i >= 2 * nblk) return;
    const int64_t row_bytes = a->Hkv * a->D * (a->is_bf16 ? 2 : 4), blk = i < nblk ? i : i - nblk;
    const int64_t n = L - blk * bs < bs ? L - blk * bs : bs, lines = (n * row_bytes + 63) / 64;
    const char *base = (const char *)(i < nblk ? a->k_cache : a->v_cache) + bt[blk] * bs * row_bytes;
    for (int64_t l = lines * part / parts; l < lines * (part + 1) / parts; ++l)
        __builtin_prefetch(base + 64 * l, 0, 3);
}

/* Block rows as float32: converted into buf (bf16), or the cache memory itself (f32). */
static inline const float *block_rows(const char *cache, int64_t block, int64_t n, int64_t row_elems, int is_bf16,
                                      float *buf) {
    const char *src = cache + block * row_elems * (is_bf16 ? 2 : 4);
    if (!is_bf16) return (const float *)src;
    load_row(buf, src, n * row_elems, 1);
    return buf;
}

/* One pass over a sequence's blocks: scores (pass 0) or weighted V sum (pass 1), for all R query rows. */
static inline __attribute__((always_inline)) void sweep(const Args *a, const int64_t *bt, int64_t L, int pass,
                                                        const float *qf, float *scores, float *acc, float *buf,
                                                        int64_t M, const int NC) {
    const int64_t bs = a->block_size, D = a->D, HD = a->Hkv * D, R = a->Hkv * M, nblk = (L + bs - 1) / bs;
    const char *cache = (const char *)(pass == 0 ? a->k_cache : a->v_cache);
    if (pass == 0)
        for (int64_t i = 0; i < PF_AHEAD; ++i) prefetch_stream(a, bt, L, i, 0, 1);
    for (int64_t blk = 0, p0 = 0; p0 < L; ++blk, p0 += bs) {
        const int64_t n = L - p0 < bs ? L - p0 : bs;
        const float *rows = block_rows(cache, bt[blk] * bs, n, HD, a->is_bf16, buf);
        for (int64_t r = 0; r < R; ++r) {
            prefetch_stream(a, bt, L, pass * nblk + blk + PF_AHEAD, r, R);
            const float *head_rows = rows + (r / M) * D;
            if (pass == 0)
                score_rows(qf + r * D, head_rows, HD, n, D, scores + r * L + p0, NC);
            else
                weighted_sum(acc + r * D, scores + r * L + p0, head_rows, HD, n, D, NC);
        }
    }
}

/* One sequence, all heads: cache rows are read whole (all kv heads, contiguous within a block) in block
 * order, each block converted to float once; blocks are prefetched ahead of use (prefetch_stream). */
static void attend_seq(const Args *a, int64_t b, float *work) {
    const int64_t H = a->H, Hkv = a->Hkv, D = a->D, bs = a->block_size, G = H / Hkv, HD = Hkv * D;
    const int64_t Q = a->q_len[b], L = a->seq_len[b], ctx = L - Q, M = Q * G, t0 = a->q_start[b];
    const int64_t esz = a->is_bf16 ? 2 : 4, R = Hkv * M;
    const int64_t *bt = a->block_tables + b * a->max_blocks;
    /* query row r = h * M + m, with m = j * G + g: token j, query head h * G + g */
    float *qf = work, *acc = qf + R * D, *buf = acc + R * D, *scores = buf + bs * HD; /* scores: [R, L] */

    for (int64_t r = 0; r < R; ++r) {
        const int64_t h = r / M, m = r % M;
        load_row(qf + r * D, (const char *)a->q + ((t0 + m / G) * H + h * G + m % G) * D * esz, D, a->is_bf16);
        for (int64_t d = 0; d < D; ++d) qf[r * D + d] *= a->scale;
    }
    if (D == 64) sweep(a, bt, L, 0, qf, scores, acc, buf, M, 4);
    else if (D == 128) sweep(a, bt, L, 0, qf, scores, acc, buf, M, 8);
    else sweep(a, bt, L, 0, qf, scores, acc, buf, M, 0);
    for (int64_t r = 0; r < R; ++r) { /* hide new keys the query token may not see */
        const int64_t j = (r % M) / G;
        for (int64_t n = 0; n < Q; ++n) {
            const int vis = a->allowed ? (int)((((uint64_t)a->allowed[t0 + j]) >> n) & 1u) : (n <= j);
            if (!vis) scores[r * L + ctx + n] = -INFINITY;
        }
        softmax_row(scores + r * L, L);
    }
    memset(acc, 0, (size_t)(R * D) * sizeof(float));
    if (D == 64) sweep(a, bt, L, 1, qf, scores, acc, buf, M, 4);
    else if (D == 128) sweep(a, bt, L, 1, qf, scores, acc, buf, M, 8);
    else sweep(a, bt, L, 1, qf, scores, acc, buf, M, 0);
    for (int64_t r = 0; r < R; ++r) {
        const int64_t h = r / M, m = r % M;
        const int64_t off = ((t0 + m / G) * H + h * G + m % G) * D;
        if (a->is_bf16) {
            uint16_t *o = (uint16_t *)a->out + off;
            for (int64_t d = 0; d < D; ++d) o[d] = f32_to_bf16(acc[r * D + d]);
        } else {
            memcpy((float *)a->out + off, acc + r * D, (size_t)D * sizeof(float));
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define SEER_BF16_FAST 1
/* bf16 fast path (D = 32 * NC2, NC2 in {1, 2, 4}; AVX512-BF16). Changes against the loops above:
 *  - one pass over the keys with an online softmax (running max m, running sum l, accumulator rescaled when m
 *    grows), so each K and V row is read once, straight from the cache, never converted to a float buffer;
 *  - q . k with vdpbf16ps: bf16 pairs multiplied exactly and summed in float32, the same products as the float
 *    loops since q and k are bf16 already;
 *  - weights p = 2^(s - m) in float32 (l sums them), rounded to bf16 for the value product as PyTorch's CPU
 *    flash attention does for bf16. V rows of two keys are interleaved (vpunpck{l,h}wd) so one vdpbf16ps adds
 *    p0 * v0 + p1 * v1 for 16 dims; that permutes the accumulator's dims within each 32-dim chunk: position
 *    e * 16 + 4 * L + k holds dim 8 * L + 4 * e + k (undone when writing the output);
 *  - lazy rescaling: m is raised only when a score exceeds it by RESCALE_LOG2 (so p <= 2^8), which skips the
 *    horizontal max of almost every tile; the result is the same ratio acc / l;
 *  - shared prefixes (cascade): consecutive sequences whose block tables start with the same blocks (siblings
 *    of one prompt under prefix caching, which the plan sorts together) form a group. The shared blocks are
 *    read once per group: each 16-key tile of K is transposed once (lanes = keys, so scores need no horizontal
 *    sums) and its V rows interleaved once, then every sibling's rows are scored and accumulated against it.
 *    The online-softmax state then simply continues over each sibling's own blocks.
 * Work unit: a group (a lone sequence is a group of one), tiles of up to 16 keys of one kv head. */

#define RESCALE_LOG2 8.f
#define GROUP_MAX 16 /* sequences per group: bounds the work buffer and keeps groups spread over threads */
#ifndef PREFETCH_LINES
#define PREFETCH_LINES 192 /* lines (K and V together) fetched ahead of use, into L2 */
#endif

/* 2^x, relative error ~2e-7 (Cephes exp2f polynomial); lanes outside `keep` are 0 (they may be NaN inside). */
static inline __m512 exp2_512(__mmask16 keep, __m512 x) {
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

/* Online-softmax state of one sequence: rows r = h * M + m (m = j * G + g: token j, query head h * G + g). */
typedef struct {
    float *acc;   /* [R][D], permuted dims (see above) */
    float *lsum;  /* [R][16] lane-wise partial sums of p */
    float *mx;    /* [R] running max, log2 units */
    float *alpha; /* [M] rescale factor of each row of the current head, for the current tile */
    uint32_t *pw; /* [M][8] the current tile's weights of those rows, as bf16 pairs */
    const uint16_t **q; /* [R] each row's query vector */
} State;

typedef struct {
    int64_t Q, L, ctx, M, R, t0;
    const int64_t *bt;
    State st;
} Seq;

static inline int64_t state_floats(int64_t R, int64_t M, int64_t D) {
    return ((R * D + R * 16 + R + M + 8 * M + 1) & ~(int64_t)1) + 2 * R + 16;
}

static inline Seq seq_begin(const Args *a, int64_t b, float *base) {
    Seq s;
    s.Q = a->q_len[b], s.L = a->seq_len[b], s.ctx = s.L - s.Q, s.M = s.Q * (a->H / a->Hkv), s.R = a->Hkv * s.M;
    s.t0 = a->q_start[b], s.bt = a->block_tables + b * a->max_blocks;
    s.st.acc = base, s.st.lsum = base + s.R * a->D, s.st.mx = s.st.lsum + s.R * 16, s.st.alpha = s.st.mx + s.R;
    s.st.pw = (uint32_t *)(s.st.alpha + s.M);
    s.st.q = (const uint16_t **)(base + ((s.R * a->D + s.R * 16 + s.R + s.M + 8 * s.M + 1) & ~(int64_t)1));
    const int64_t G = a->H / a->Hkv;
    for (int64_t r = 0; r < s.R; ++r) {
        const int64_t h = r / s.M, m = r % s.M;
        s.st.q[r] = (const uint16_t *)a->q + ((s.t0 + m / G) * a->H + h * G + m % G) * a->D;
    }
    memset(s.st.acc, 0, (size_t)(s.R * a->D) * sizeof(float));
    memset(s.st.lsum, 0, (size_t)(s.R * 16) * sizeof(float));
    for (int64_t r = 0; r < s.R; ++r) s.st.mx[r] = -INFINITY;
    return s;
}

/* visibility of the tile's keys [pos0, pos0 + nt) to new token j (positions >= ctx are new keys) */
static inline __mmask16 tile_mask(const Args *a, const Seq *s, int64_t j, int64_t pos0, int nt) {
    __mmask16 mk = nt >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nt) - 1u);
    if (pos0 + nt <= s->ctx) return mk;
    for (int t = 0; t < nt; ++t) {
        const int64_t nn = pos0 + t - s->ctx;
        if (nn < 0) continue;
        const int vis = a->allowed ? (nn < 64 && ((((uint64_t)a->allowed[s->t0 + j]) >> nn) & 1u)) : (nn <= j);
        if (!vis) mk &= (__mmask16)~(1u << t);
    }
    return mk;
}

/* One row, one tile: raw scores -> online-softmax update, the row's bf16 weights into pw[0..8), alpha. */
static inline void softmax_tile(__m512 raw, __mmask16 mk, float scale2, float *mx, float *lsum, float *alpha,
                                uint32_t *pw) {
    const __m512 s = _mm512_mul_ps(raw, _mm512_set1_ps(scale2));
    float mo = *mx, al = 1.f;
    if (_mm512_mask_cmp_ps_mask(mk, s, _mm512_set1_ps(mo + RESCALE_LOG2), _CMP_GT_OQ)) {
        const float mn = _mm512_mask_reduce_max_ps(mk, s);
        al = exp2f(mo - mn); /* 0 when mo = -inf (nothing accumulated yet) */
        *mx = mo = mn;
    }
    const __m512 p = exp2_512(mk, _mm512_sub_ps(s, _mm512_set1_ps(mo)));
    __m512 l = _mm512_loadu_ps(lsum);
    if (al != 1.f) l = _mm512_mul_ps(l, _mm512_set1_ps(al));
    _mm512_storeu_ps(lsum, _mm512_add_ps(l, p));
    *alpha = al;
    _mm256_storeu_si256((__m256i *)pw, (__m256i)_mm512_cvtneps_pbh(p));
}

/* Lane k of the result = q . (key row k), k < 16, for rows k + t * stride (t >= nt repeats row nt - 1). */
static inline __attribute__((always_inline)) __m512 score16_bf16(const uint16_t *q, const uint16_t *k,
                                                                 int64_t stride, int nt, const int NC2) {
    __m512bh qv[4];
    for (int c = 0; c < NC2; ++c) qv[c] = (__m512bh)_mm512_loadu_si512((const void *)(q + 32 * c));
    __m512 acc[16];
    for (int t = 0; t < 16; ++t) {
        const uint16_t *kr = k + (t < nt ? t : nt - 1) * stride;
        acc[t] = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_loadu_si512((const void *)kr), qv[0]);
        for (int c = 1; c < NC2; ++c)
            acc[t] = _mm512_dpbf16_ps(acc[t], (__m512bh)_mm512_loadu_si512((const void *)(kr + 32 * c)), qv[c]);
    }
    return hsum16(acc);
}

/* MR rows (acc row stride D): acc <- alpha * acc + sum_t p[t] * v[t], V rows read from the cache, interleaved
 * in registers. CH chunks of 32 dims per pass, as in pv_tile. */
static inline __attribute__((always_inline)) void pv_bf16(float *acc, int64_t D, const float *alpha,
                                                          const uint32_t *pw, const uint16_t *v, int64_t stride,
                                                          int nt, const int NC2, const int MR) {
    const int CH = MR * NC2 <= 8 ? NC2 : 1;
    for (int c0 = 0; c0 < NC2; c0 += CH) {
        __m512 A[4][8];
        for (int r = 0; r < MR; ++r) {
            const __m512 al = _mm512_set1_ps(alpha[r]);
            for (int u = 0; u < 2 * CH; ++u) A[r][u] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * D + 32 * c0 + 16 * u), al);
        }
        for (int t = 0; t < nt; t += 2) {
            const uint16_t *v0 = v + t * stride + 32 * c0, *v1 = t + 1 < nt ? v0 + stride : v0;
            __m512bh x[8];
            for (int c = 0; c < CH; ++c) {
                const __m512i x0 = _mm512_loadu_si512((const void *)(v0 + 32 * c));
                const __m512i x1 = _mm512_loadu_si512((const void *)(v1 + 32 * c));
                x[2 * c] = (__m512bh)_mm512_unpacklo_epi16(x0, x1);
                x[2 * c + 1] = (__m512bh)_mm512_unpackhi_epi16(x0, x1);
            }
            for (int r = 0; r < MR; ++r) {
                const __m512bh w = (__m512bh)_mm512_set1_epi32((int)pw[r * 8 + t / 2]);
                for (int u = 0; u < 2 * CH; ++u) A[r][u] = _mm512_dpbf16_ps(A[r][u], x[u], w);
            }
        }
        for (int r = 0; r < MR; ++r)
            for (int u = 0; u < 2 * CH; ++u) _mm512_storeu_ps(acc + r * D + 32 * c0 + 16 * u, A[r][u]);
    }
}

/* The same from a tile whose V pairs were interleaved once into vi (see interleave_v). CH chunks of 32 dims per
 * pass: all of them when the accumulators fit in registers (more independent vdpbf16ps chains). */
static inline __attribute__((always_inline)) void pv_tile(float *acc, int64_t D, const float *alpha,
                                                          const uint32_t *pw, const uint32_t *vi, int npairs,
                                                          const int NC2, const int MR) {
    const int CH = MR * NC2 <= 8 ? NC2 : 1;
    for (int c0 = 0; c0 < NC2; c0 += CH) {
        __m512 A[4][8];
        for (int r = 0; r < MR; ++r) {
            const __m512 al = _mm512_set1_ps(alpha[r]);
            for (int u = 0; u < 2 * CH; ++u) A[r][u] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * D + 32 * c0 + 16 * u), al);
        }
        for (int p = 0; p < npairs; ++p) {
            __m512bh x[8];
            for (int u = 0; u < 2 * CH; ++u)
                x[u] = (__m512bh)_mm512_load_si512((const void *)(vi + (p * NC2 + c0) * 32 + 16 * u));
            for (int r = 0; r < MR; ++r) {
                const __m512bh w = (__m512bh)_mm512_set1_epi32((int)pw[r * 8 + p]);
                for (int u = 0; u < 2 * CH; ++u) A[r][u] = _mm512_dpbf16_ps(A[r][u], x[u], w);
            }
        }
        for (int r = 0; r < MR; ++r)
            for (int u = 0; u < 2 * CH; ++u) _mm512_storeu_ps(acc + r * D + 32 * c0 + 16 * u, A[r][u]);
    }
}

/* 16x16 dword transpose in registers: r[t] = row t in, r[i] = column i out (lane t = row t). */
static inline __attribute__((always_inline)) void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; ++i) { /* 128-bit lane L: rows 2i, 2i+1 interleaved, columns 4L..4L+1 | 4L+2..4L+3 */
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; ++g) { /* r[4g + k], lane L: column 4L + k of rows 4g..4g+3 */
        r[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int k = 0; k < 4; ++k) {
        const __m512i xe = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x88), xo = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xDD);
        const __m512i ye = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x88);
        const __m512i yo = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xDD);
        t[k] = _mm512_shuffle_i32x4(xe, ye, 0x88);
        t[8 + k] = _mm512_shuffle_i32x4(xe, ye, 0xDD);
        t[4 + k] = _mm512_shuffle_i32x4(xo, yo, 0x88);
        t[12 + k] = _mm512_shuffle_i32x4(xo, yo, 0xDD);
    }
    for (int i = 0; i < 16; ++i) r[i] = t[i];
}

/* kt[i * 16 + t] = dword i (bf16 dims 2i, 2i+1) of key row t, t < 16 (t >= nt repeats row nt - 1). */
static inline __attribute__((always_inline)) void transpose_k(const uint16_t *k, int64_t stride, int nt,
                                                              uint32_t *kt, const int NC2) {
    for (int c = 0; c < NC2; ++c) {
        __m512i r[16];
        for (int t = 0; t < 16; ++t)
            r[t] = _mm512_loadu_si512((const void *)(k + (t < nt ? t : nt - 1) * stride + 32 * c));
        transpose16(r);
        for (int i = 0; i < 16; ++i) _mm512_store_si512((void *)(kt + (16 * c + i) * 16), r[i]);
    }
}

/* vi[(p * NC2 + c) * 32 + e * 16 ...] = chunk c of V rows 2p, 2p+1 interleaved (e = unpacklo/hi). */
static inline __attribute__((always_inline)) void interleave_v(const uint16_t *v, int64_t stride, int nt,
                                                               uint32_t *vi, const int NC2) {
    for (int p = 0; 2 * p < nt; ++p) {
        const uint16_t *v0 = v + 2 * p * stride, *v1 = 2 * p + 1 < nt ? v0 + stride : v0;
        for (int c = 0; c < NC2; ++c) {
            const __m512i x0 = _mm512_loadu_si512((const void *)(v0 + 32 * c));
            const __m512i x1 = _mm512_loadu_si512((const void *)(v1 + 32 * c));
            _mm512_store_si512((void *)(vi + (p * NC2 + c) * 32), _mm512_unpacklo_epi16(x0, x1));
            _mm512_store_si512((void *)(vi + (p * NC2 + c) * 32 + 16), _mm512_unpackhi_epi16(x0, x1));
        }
    }
}

/* Raw scores of MR query rows against a transposed tile: lanes = keys. */
static inline __attribute__((always_inline)) void scores_t(const uint32_t *kt, const uint16_t *const *q,
                                                           __m512 *out, const int NC2, const int MR) {
    __m512 acc[4][4]; /* four accumulators per row: dependency chains short enough to keep vdpbf16ps busy */
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm512_setzero_ps();
    for (int i = 0; i < 16 * NC2; i += 4) {
        __m512bh k[4];
        for (int u = 0; u < 4; ++u) k[u] = (__m512bh)_mm512_load_si512((const void *)(kt + 16 * (i + u)));
        for (int r = 0; r < MR; ++r)
            for (int u = 0; u < 4; ++u) {
                int32_t qi;
                memcpy(&qi, q[r] + 2 * (i + u), sizeof qi);
                acc[r][u] = _mm512_dpbf16_ps(acc[r][u], k[u], (__m512bh)_mm512_set1_epi32(qi));
            }
    }
    for (int r = 0; r < MR; ++r)
        out[r] = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
}

/* Rows [m0, m0 + MR) of head h of sequence s against one tile: transposed (kt, vi) or straight from the cache
 * (k, v with row stride HD). `masked`: the tile may hold new keys, apply each row's visibility. */
static inline __attribute__((always_inline)) void rows_tile(const Args *a, Seq *s, int64_t h, int64_t m0,
                                                            const uint32_t *kt, const uint32_t *vi,
                                                            const uint16_t *k, const uint16_t *v, int64_t pos0,
                                                            int nt, int masked, const int TR, const int NC2,
                                                            const int MR) {
    const int64_t D = 32 * NC2, G = a->H / a->Hkv, r0 = h * s->M + m0;
    const float scale2 = a->scale * 1.44269504088896341f;
    const __mmask16 full = nt >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nt) - 1u);
    __m512 sc[4];
    const uint16_t *q[4];
    for (int r = 0; r < MR; ++r) q[r] = s->st.q[r0 + r];
    if (TR) {
        scores_t(kt, q, sc, NC2, MR);
    } else {
        for (int r = 0; r < MR; ++r) sc[r] = nt == 16 ? score16_bf16(q[r], k, a->Hkv * D, 16, NC2)
                                                      : score16_bf16(q[r], k, a->Hkv * D, nt, NC2);
    }
    for (int r = 0; r < MR; ++r) {
        const __mmask16 mk = masked ? tile_mask(a, s, (m0 + r) / G, pos0, nt) : full;
        softmax_tile(sc[r], mk, scale2, s->st.mx + r0 + r, s->st.lsum + (r0 + r) * 16, s->st.alpha + m0 + r,
                     s->st.pw + (m0 + r) * 8);
    }
    float *acc = s->st.acc + r0 * D;
    if (TR) pv_tile(acc, D, s->st.alpha + m0, s->st.pw + m0 * 8, vi, (nt + 1) / 2, NC2, MR);
    else if (nt == 16) pv_bf16(acc, D, s->st.alpha + m0, s->st.pw + m0 * 8, v, a->Hkv * D, 16, NC2, MR);
    else pv_bf16(acc, D, s->st.alpha + m0, s->st.pw + m0 * 8, v, a->Hkv * D, nt, NC2, MR);
}

static inline __attribute__((always_inline)) void all_rows_tile(const Args *a, Seq *s, int64_t h,
                                                                const uint32_t *kt, const uint32_t *vi,
                                                                const uint16_t *k, const uint16_t *v,
                                                                int64_t pos0, int nt, int masked, const int TR,
                                                                const int NC2) {
    for (int64_t m0 = 0; m0 < s->M; m0 += 4) {
        switch (s->M - m0 < 4 ? s->M - m0 : 4) {
        case 1: rows_tile(a, s, h, m0, kt, vi, k, v, pos0, nt, masked, TR, NC2, 1); break;
        case 2: rows_tile(a, s, h, m0, kt, vi, k, v, pos0, nt, masked, TR, NC2, 2); break;
        case 3: rows_tile(a, s, h, m0, kt, vi, k, v, pos0, nt, masked, TR, NC2, 3); break;
        default: rows_tile(a, s, h, m0, kt, vi, k, v, pos0, nt, masked, TR, NC2, 4); break;
        }
    }
}

/* The groups of one call; `next` hands them out. A thread claims its next group before the own-block phase of
 * the current one, so it can start fetching that group's first lines while still computing. */
typedef struct {
    const int64_t *starts, *sizes, *shared;
    int64_t count, next;
} Groups;

/* Prefetch pacing: a group's blocks in the order they are used (shared ones, then each member's own), fetched
 * line by line (into L2) at the rate the group's work proceeds, PREFETCH_LINES ahead; a unit of work is one
 * tile of one head for one member. Fetching whole blocks a fixed distance ahead gained nothing: the shared
 * phase is compute-heavy (memory idle), the own phase then wanted more bandwidth than one core gets, and
 * bursts of prefetches seem to be dropped once the miss queues are full. */
typedef struct {
    int64_t b0, S, shared;
    int64_t member, blk, line; /* next line to prefetch: member -1 = shared phase */
    int64_t done_lines, total_lines, done_units, total_units, shared_units;
} Pacer;

static inline int64_t seq_blocks(const Args *a, int64_t b) { return (a->seq_len[b] + a->block_size - 1) / a->block_size; }

static inline int64_t block_lines(const Args *a, int64_t b, int64_t blk) { /* of K (V has as many) */
    const int64_t left = a->seq_len[b] - blk * a->block_size, rows = left < a->block_size ? left : a->block_size;
    return (rows * a->Hkv * a->D * 2 + 63) / 64;
}

static void pacer_init(const Args *a, const Groups *gr, int64_t g, Pacer *pc) {
    const int64_t b0 = gr->starts[g], S = gr->sizes[g], shared = gr->shared[g], tiles = (a->block_size + 15) / 16;
    *pc = (Pacer){b0, S, shared, -1, 0, 0, 0, 0, 0, 0, S * shared * tiles * a->Hkv};
    pc->total_units = pc->shared_units;
    for (int64_t i = 0; i < S; ++i) {
        const int64_t nb = seq_blocks(a, b0 + i);
        pc->total_units += (nb - shared) * tiles * a->Hkv;
        for (int64_t blk = i == 0 ? 0 : shared; blk < nb; ++blk) pc->total_lines += 2 * block_lines(a, b0 + i, blk);
    }
    if (pc->total_units == 0) pc->total_units = 1;
}

/* Prefetch K and V lines until `target` (counting both) have been requested. */
static void pacer_fetch(const Args *a, Pacer *pc, int64_t target) {
    if (target > pc->total_lines) target = pc->total_lines;
    while (pc->done_lines < target) {
        if (pc->member < 0 && pc->blk >= pc->shared) pc->member = 0, pc->blk = pc->shared;
        while (pc->member >= 0 && pc->member < pc->S && pc->blk >= seq_blocks(a, pc->b0 + pc->member))
            ++pc->member, pc->blk = pc->shared;
        if (pc->member >= pc->S) break;
        const int64_t b = pc->b0 + (pc->member < 0 ? 0 : pc->member), nl = block_lines(a, b, pc->blk);
        const int64_t off = a->block_tables[b * a->max_blocks + pc->blk] * a->block_size * a->Hkv * a->D * 2;
        const char *k = (const char *)a->k_cache + off, *v = (const char *)a->v_cache + off;
        for (; pc->line < nl && pc->done_lines < target; ++pc->line, pc->done_lines += 2) {
            __builtin_prefetch(k + 64 * pc->line, 0, 2);
            __builtin_prefetch(v + 64 * pc->line, 0, 2);
        }
        if (pc->line >= nl) ++pc->blk, pc->line = 0;
    }
}

/* `units` more work done in pc's group; nx (the next group, when claimed) gets its first PREFETCH_LINES lines
 * spread over this group's own-block phase. */
static void pacer_step(const Args *a, Pacer *pc, Pacer *nx, int64_t units) {
    pc->done_units += units;
    pacer_fetch(a, pc, PREFETCH_LINES + (pc->done_units * pc->total_lines + pc->total_units - 1) / pc->total_units);
    if (nx) {
        const int64_t own_total = pc->total_units - pc->shared_units, own_done = pc->done_units - pc->shared_units;
        pacer_fetch(a, nx, own_total > 0 ? PREFETCH_LINES * own_done / own_total : PREFETCH_LINES);
    }
}

/* Group g: sequences [b0, b0 + S) sharing their first `shared` blocks (all inside every member's cached
 * context). pc: its pacer (lines already fetched are kept). Claims the next group into *claimed, *npc. */
static inline __attribute__((always_inline)) void attend_group_bf16(const Args *a, Groups *gr, int64_t g,
                                                                    Pacer *pc, int64_t *claimed, Pacer *npc,
                                                                    float *work, const int NC2) {
    const int64_t b0 = gr->starts[g], S = gr->sizes[g], shared = gr->shared[g];
    const int64_t D = 32 * NC2, bs = a->block_size, Hkv = a->Hkv, HD = Hkv * D, G = a->H / Hkv;
    const uint16_t *kc = (const uint16_t *)a->k_cache, *vc = (const uint16_t *)a->v_cache;
    uint32_t *kt = (uint32_t *)work, *vi = kt + 8 * D; /* 64-byte aligned, 8 * D dwords each */
    float *states = work + 16 * D;
    Seq seqs[GROUP_MAX];
    int64_t stride = 0;
    for (int64_t i = 0; i < S; ++i) {
        const int64_t M = a->q_len[b0 + i] * G;
        seqs[i] = seq_begin(a, b0 + i, states + stride);
        stride += state_floats(Hkv * M, M, D);
    }
    pacer_step(a, pc, NULL, 0);
    /* shared blocks: each tile transposed once, used by every member */
    for (int64_t blk = 0; blk < shared; ++blk) {
        const uint16_t *kblk = kc + seqs[0].bt[blk] * bs * HD, *vblk = vc + seqs[0].bt[blk] * bs * HD;
        for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t s0 = 0; s0 < bs; s0 += 16) {
                const int nt = (int)(bs - s0 < 16 ? bs - s0 : 16);
                transpose_k(kblk + s0 * HD + h * D, HD, nt, kt, NC2);
                interleave_v(vblk + s0 * HD + h * D, HD, nt, vi, NC2);
                for (int64_t i = 0; i < S; ++i) {
                    all_rows_tile(a, &seqs[i], h, kt, vi, NULL, NULL, blk * bs + s0, nt, 0, 1, NC2);
                    pacer_step(a, pc, NULL, 1);
                }
            }
    }
    *claimed = __atomic_fetch_add(&gr->next, 1, __ATOMIC_RELAXED);
    Pacer *nx = NULL;
    if (*claimed < gr->count) pacer_init(a, gr, *claimed, npc), nx = npc;
    /* each member's own blocks (K rows read straight from the cache: with one member's few rows per head,
     * transposing the tile costs more than the horizontal sums it saves), then its output */
    for (int64_t i = 0; i < S; ++i) {
        Seq *s = &seqs[i];
        for (int64_t blk = shared, p0 = shared * bs; p0 < s->L; ++blk, p0 += bs) {
            const int64_t n = s->L - p0 < bs ? s->L - p0 : bs;
            const uint16_t *kblk = kc + s->bt[blk] * bs * HD, *vblk = vc + s->bt[blk] * bs * HD;
            for (int64_t h = 0; h < Hkv; ++h)
                for (int64_t s0 = 0; s0 < n; s0 += 16) {
                    const int nt = (int)(n - s0 < 16 ? n - s0 : 16);
                    all_rows_tile(a, s, h, NULL, NULL, kblk + s0 * HD + h * D, vblk + s0 * HD + h * D, p0 + s0,
                                  nt, p0 + s0 + nt > s->ctx, 0, NC2);
                    pacer_step(a, pc, nx, 1);
                }
        }
        for (int64_t r = 0; r < s->R; ++r) { /* out = acc / l, dims un-permuted, rounded to bf16 */
            const int64_t h = r / s->M, m = r % s->M;
            uint16_t *o = (uint16_t *)a->out + ((s->t0 + m / G) * a->H + h * G + m % G) * D;
            const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(_mm512_loadu_ps(s->st.lsum + r * 16)));
            /* chunk c: lo = dims 8L + k (lane 4L + k), hi = dims 8L + 4 + k; output dim d' < 16 of a half:
             * L = d' / 8 (+2 for the second half), e = (d' / 4) & 1, k = d' & 3 -> source e * 16 + 4L + k */
            const __m512i idx0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
            const __m512i idx1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
            for (int c = 0; c < NC2; ++c) {
                const __m512 lo = _mm512_loadu_ps(s->st.acc + r * D + 32 * c);
                const __m512 hi = _mm512_loadu_ps(s->st.acc + r * D + 32 * c + 16);
                const __m512 o0 = _mm512_mul_ps(_mm512_permutex2var_ps(lo, idx0, hi), inv);
                const __m512 o1 = _mm512_mul_ps(_mm512_permutex2var_ps(lo, idx1, hi), inv);
                _mm256_storeu_si256((__m256i *)(o + 32 * c), (__m256i)_mm512_cvtneps_pbh(o0));
                _mm256_storeu_si256((__m256i *)(o + 32 * c + 16), (__m256i)_mm512_cvtneps_pbh(o1));
            }
        }
    }
}

typedef void (*GroupFn)(const Args *, Groups *, int64_t, Pacer *, int64_t *, Pacer *, float *);
static void group_d32(const Args *a, Groups *gr, int64_t g, Pacer *pc, int64_t *c, Pacer *npc, float *w) {
    attend_group_bf16(a, gr, g, pc, c, npc, w, 1);
}
static void group_d64(const Args *a, Groups *gr, int64_t g, Pacer *pc, int64_t *c, Pacer *npc, float *w) {
    attend_group_bf16(a, gr, g, pc, c, npc, w, 2);
}
static void group_d128(const Args *a, Groups *gr, int64_t g, Pacer *pc, int64_t *c, Pacer *npc, float *w) {
    attend_group_bf16(a, gr, g, pc, c, npc, w, 4);
}

/* Number of leading blocks b and c share that lie wholly inside both cached contexts. */
static int64_t common_blocks(const Args *a, int64_t b, int64_t c) {
    const int64_t *x = a->block_tables + b * a->max_blocks, *y = a->block_tables + c * a->max_blocks;
    const int64_t kb = (a->seq_len[b] - a->q_len[b]) / a->block_size, kc = (a->seq_len[c] - a->q_len[c]) / a->block_size;
    int64_t n = 0;
    while (n < kb && n < kc && x[n] == y[n]) ++n;
    return n;
}

/* Groups of consecutive sequences (the plan orders them by first block) sharing their leading blocks:
 * starts[g], sizes[g], shared[g] (number of shared blocks; 0 for a lone sequence). */
static int64_t make_groups(const Args *a, int64_t num_seqs, int64_t *starts, int64_t *sizes, int64_t *shared) {
    int64_t ng = 0;
    for (int64_t b = 0; b < num_seqs;) {
        int64_t e = b + 1, k = b + 1 < num_seqs ? common_blocks(a, b, b + 1) : 0;
        /* a leader sharing less with its successor than that one with the next is an odd one out: alone */
        if (k > 0 && b + 2 < num_seqs && common_blocks(a, b + 1, b + 2) > k) k = 0;
        if (k > 0)
            while (e < num_seqs && e - b < GROUP_MAX && common_blocks(a, e - 1, e) >= k) ++e;
        starts[ng] = b, sizes[ng] = e - b, shared[ng] = e - b > 1 ? k : 0;
        ++ng;
        b = e;
    }
    return ng;
}
#endif

/* Returns 0 on success, 1 when a work buffer could not be allocated. */
int seer_paged_attention(const void *q, void *out, const void *k_cache, const void *v_cache,
                         const int64_t *block_tables, int64_t max_blocks, const int64_t *q_start,
                         const int64_t *q_len, const int64_t *seq_len, const int64_t *allowed, int64_t num_seqs,
                         int64_t H, int64_t Hkv, int64_t D, int64_t block_size, float scale, int is_bf16,
                         int num_threads) {
    const Args a = {q, out, k_cache, v_cache, block_tables, q_start, q_len, seq_len, allowed,
                    max_blocks, H, Hkv, D, block_size, scale, is_bf16};
    int64_t max_rl = 0, max_r = 0; /* rows (query heads x tokens) and rows x keys of the largest sequence */
    for (int64_t b = 0; b < num_seqs; ++b) {
        const int64_t r = q_len[b] * H;
        if (r * seq_len[b] > max_rl) max_rl = r * seq_len[b];
        if (r > max_r) max_r = r;
    }
    int failed = 0;
#ifdef SEER_BF16_FAST
    GroupFn group_fn =
        !is_bf16 ? NULL : D == 64 ? group_d64 : D == 128 ? group_d128 : D == 32 ? group_d32 : NULL;
    if (group_fn) {
        int64_t *groups = (int64_t *)malloc((size_t)(3 * num_seqs + 1) * sizeof(int64_t));
        if (!groups) return 1;
        int64_t *starts = groups, *sizes = groups + num_seqs, *shared = groups + 2 * num_seqs;
        Groups gr = {starts, sizes, shared, make_groups(&a, num_seqs, starts, sizes, shared), 0};
        const int64_t max_m = max_r / Hkv;
        const size_t per_thread = (size_t)(16 * D + GROUP_MAX * state_floats(max_r, max_m, D));
#pragma omp parallel num_threads(num_threads)
        {
            float *work = NULL;
            if (posix_memalign((void **)&work, 64, per_thread * sizeof(float)) != 0) {
                work = NULL;
#pragma omp atomic write
                failed = 1;
            }
            Pacer pacers[2];
            int cur = 0;
            int64_t g = work ? __atomic_fetch_add(&gr.next, 1, __ATOMIC_RELAXED) : gr.count;
            if (g < gr.count) pacer_init(&a, &gr, g, &pacers[0]);
            while (g < gr.count) {
                int64_t claimed = gr.count;
                group_fn(&a, &gr, g, &pacers[cur], &claimed, &pacers[1 - cur], work);
                g = claimed, cur = 1 - cur;
            }
            free(work);
        }
        free(groups);
        return failed;
    }
#endif
    const size_t per_thread = (size_t)(2 * max_r * D + block_size * Hkv * D + max_rl + 16);
#pragma omp parallel num_threads(num_threads)
    {
        float *work = (float *)malloc(per_thread * sizeof(float));
        if (!work) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 2)
        for (int64_t b = 0; b < num_seqs; ++b)
            if (work) attend_seq(&a, b, work);
        free(work);
    }
    return failed;
}
