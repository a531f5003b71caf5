/* Paged attention for short queries (decode, speculative verify) on CPU.
 *
 * Why C: in pure PyTorch a decode step must first gather every sequence's KV blocks into a padded dense tensor
 * and then run SDPA on it, touching the cache three times with poorly shaped kernels (q_len 1); at 256
 * sequences x 300 tokens that is ~10x the memory-bandwidth floor. This kernel reads each cached K/V row once,
 * straight from the block table. seer/models/attn_kernel.py compiles it on first use (cc -O3 -march=native
 * -fopenmp) and falls back to the PyTorch path when no compiler is available.
 *
 * Work item = one sequence; its cache rows are read whole (all kv heads, contiguous within a block) in block
 * order with software prefetch, because scattered per-head reads left the loop waiting on memory latency.
 * For each kv head, its M = q_len * G query rows (G query heads share one kv head) are scored against all
 * visible keys, softmaxed and used to weight V, all in float32. Visibility: every cached key
 * (position < ctx = seq_len - q_len) and, among the new keys, those whose bit is set in allowed[token]
 * (ancestors and self for tree verification) or, without `allowed`, keys 0..j (a causal chain).
 * AVX-512 paths are used when the compiler targets it; the portable loops are the reference semantics.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
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
#endif
    for (; p < L; ++p) {
        const float e = s[p] == -INFINITY ? 0.f : expf(s[p] - mx);
        s[p] = e;
        sum += e;
    }
    const float inv = 1.f / sum;
    for (p = 0; p < L; ++p) s[p] *= inv;
}

static inline void prefetch_bytes(const char *r, int64_t nbytes) {
    for (int64_t off = 0; off < nbytes; off += 64) __builtin_prefetch(r + off, 0, 3);
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
#endif
    for (int64_t o = 0; o < n; ++o)
        if (w[o] != 0.f) axpy(acc, w[o], rows + o * stride, D);
}

/* Block rows as float32: converted into buf (bf16), or the cache memory itself (f32). Prefetches `next`. */
static inline const float *block_rows(const char *cache, int64_t block, int64_t n, int64_t row_elems,
                                      const char *next, int64_t next_bytes, int is_bf16, float *buf) {
    if (next) prefetch_bytes(next, next_bytes);
    const char *src = cache + block * row_elems * (is_bf16 ? 2 : 4);
    if (!is_bf16) return (const float *)src;
    load_row(buf, src, n * row_elems, 1);
    return buf;
}

/* One pass over a sequence's blocks: scores (pass 0) or weighted V sum (pass 1), for all R query rows. */
static inline __attribute__((always_inline)) void sweep(const Args *a, const int64_t *bt, int64_t L, int pass,
                                                        const float *qf, float *scores, float *acc, float *buf,
                                                        int64_t M, const int NC) {
    const int64_t bs = a->block_size, D = a->D, HD = a->Hkv * D, R = a->Hkv * M;
    const int64_t row_bytes = HD * (a->is_bf16 ? 2 : 4);
    const char *cache = (const char *)(pass == 0 ? a->k_cache : a->v_cache);
    for (int64_t blk = 0, p0 = 0; p0 < L; ++blk, p0 += bs) {
        const int64_t n = L - p0 < bs ? L - p0 : bs;
        const int64_t n_next = L - p0 - n < bs ? L - p0 - n : bs;
        const char *next = n_next > 0 ? cache + bt[blk + 1] * bs * row_bytes : NULL;
        const float *rows = block_rows(cache, bt[blk] * bs, n, HD, next, n_next * row_bytes, a->is_bf16, buf);
        for (int64_t r = 0; r < R; ++r) {
            const float *head_rows = rows + (r / M) * D;
            if (pass == 0)
                score_rows(qf + r * D, head_rows, HD, n, D, scores + r * L + p0, NC);
            else
                weighted_sum(acc + r * D, scores + r * L + p0, head_rows, HD, n, D, NC);
        }
    }
}

/* One sequence, all heads: cache rows are read whole (all kv heads, contiguous within a block) in block
 * order, each block converted to float once; the next block is prefetched while this one is computed. */
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
    const size_t per_thread = (size_t)(2 * max_r * D + block_size * Hkv * D + max_rl + 16);
    int failed = 0;
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
