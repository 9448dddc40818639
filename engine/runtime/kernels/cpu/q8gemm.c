/* y[m, n] = x[m, k] . W[n, k]^T (+ bias), W in GGUF's Q4_1 or Q8_0 blocks and x quantized to
 * int8 per block of 32 (x ~ dx * qx with dx = max|x| / 127, qx rounded to nearest), as llama.cpp
 * computes on a CPU: each block's dot product is an exact integer sum (u8 x s8 pairs, maddubs),
 * scaled once in float32:
 *   Q4_1  y = sum over blocks of  (dw * dx) * (qw . qx) + mw * sum(x)   (sum(x) in float32)
 *   Q8_0  y = sum over blocks of  (dw * dx) * (qw . qx)
 * A maddubs does four times the multiply-adds of an FMA of the same width, and the weights are
 * not widened to float: 1.5-1.6x qgemm.c's float32 path at 16 rows, 2-3.5x at one row (Zen 1).
 * The error is x's rounding, at most dx / 2 an input (linear.py checks each weight against that
 * bound).
 *
 * Built with ``-DKVGATE_X16`` (qgemm.py builds both), x is quantized to int16 instead
 * (dx = max|x| / 32767) and a block's dot product is a sum of int16 pairs (madd: twice an FMA's
 * multiply-adds, then an add), the weights widened only to 16 bits, with 258 times finer steps
 * than int8 (on the default model within the float32 path's stated tolerance). At one row (a
 * decode step) 1.7-1.9x qgemm.c's float32 path (AVX-512, Zen 4) and 1.3-1.7x (AVX2 build);
 * at 19 rows 1.2-1.6x on AVX-512 and about even on AVX2 on Zen 4, 1.8x and 1.45x on Zen 5
 * (side by side in one process), where a broadcast, a madd and its add issue at 0.8 the rate
 * of a broadcast and an FMA.
 * Its x is stored with each 4 inputs as (0, 2, 1, 3), so that a broadcast 32-bit pair meets the
 * weights' even or odd bytes of a lane.
 *
 * The weights are packed by qgemm.py's ``pack_*`` for either build alike: a vector lane is an
 * output and holds 4 consecutive inputs' bytes (PANEL = 2 * VW outputs a panel):
 *   Q4_1  qs [panels][blocks][4][PANEL][4]: byte j of output o in part c holds input 8c + j (low
 *         nibble) and 8c + 4 + j (high); dm as qgemm.c's ([panels][blocks][2][PANEL] float16).
 *   Q8_0  qs [panels][blocks][8][PANEL][4] int8: input 4c + j;  d as qgemm.c's.
 * Integer sums are exact and every float32 operation runs in block order per row, so a row's
 * result depends on neither its batch, the thread count nor the ISA build.
 */
#include <stdlib.h>
#include <string.h>

#include "panels.h"

#if defined(__AVX512F__)
#ifndef __AVX512BW__
#error "q8gemm.c's AVX-512 build needs AVX-512BW (byte and word multiply-adds)"
#endif
#define GROUP 6
#define iload(p) _mm512_loadu_si512((const void *)(p))
#define iset1 _mm512_set1_epi32
#define izero _mm512_setzero_si512
#define iset1_8 _mm512_set1_epi8
#define iset1_16 _mm512_set1_epi16
#define iand _mm512_and_si512
#define isrl16 _mm512_srli_epi16
#define isll16 _mm512_slli_epi16
#define isra16 _mm512_srai_epi16
#define iadd16 _mm512_add_epi16
#define iadd32 _mm512_add_epi32
#define imaddubs _mm512_maddubs_epi16
#define imadd _mm512_madd_epi16
#define iabs8 _mm512_abs_epi8
/* x negated where w < 0 (where w == 0 the product is 0 either way) */
#define isign8(x, w) _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), izero(), x)
#define GROUP_SWITCH SWITCH_6
#else
#define GROUP 3
#define iload(p) _mm256_loadu_si256((const __m256i *)(p))
#define iset1 _mm256_set1_epi32
#define izero _mm256_setzero_si256
#define iset1_8 _mm256_set1_epi8
#define iset1_16 _mm256_set1_epi16
#define iand _mm256_and_si256
#define isrl16 _mm256_srli_epi16
#define isll16 _mm256_slli_epi16
#define isra16 _mm256_srai_epi16
#define iadd16 _mm256_add_epi16
#define iadd32 _mm256_add_epi32
#define imaddubs _mm256_maddubs_epi16
#define imadd _mm256_madd_epi16
#define iabs8 _mm256_abs_epi8
#define isign8 _mm256_sign_epi8
#define GROUP_SWITCH SWITCH_3
#endif

#ifdef KVGATE_X16
typedef int16_t xq_t;
#define XLEVELS 32767.0f
#define NAME(a, b) a##_q16##b /* kvgate_q4_1_q16_gemm_threads, ... */
/* input i of a group of 4 goes to (0, 2, 1, 3)[i] */
#define XSLOT(i) (((i) & ~3) | (((i) & 1) << 1) | (((i) >> 1) & 1))
#else
typedef int8_t xq_t;
#define XLEVELS 127.0f
#define NAME(a, b) a##_q8##b
#define XSLOT(i) (i)
#endif

int NAME(kvgate, gemm_panel)(void) { return PANEL; }

/* x's rows quantized: qx [m][k] (int8, or int16 with XSLOT's order), dx [m][k / 32] and (Q4_1)
 * xsum [m][k / 32], the block's float32 sum in index order. */
typedef struct {
  xq_t *qx;
  float *dx, *xsum;
} Quantized;

static void quantize_rows(const float *x, int64_t m, int64_t k, const Quantized *q) {
  const int64_t blocks = k / QBLOCK;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float *xb = x + r * k + b * QBLOCK;
      float amax = 0.0f, sum = 0.0f;
      for (int i = 0; i < QBLOCK; ++i) {
        const float a = xb[i] < 0.0f ? -xb[i] : xb[i];
        amax = a > amax ? a : amax;
        sum += xb[i];
      }
      const float d = amax / XLEVELS, id = amax > 0.0f ? XLEVELS / amax : 0.0f;
      xq_t *qb = q->qx + r * k + b * QBLOCK;
      for (int i = 0; i < QBLOCK; ++i)
        qb[XSLOT(i)] = (xq_t)_mm_cvtss_si32(_mm_set_ss(xb[i] * id));
      q->dx[r * blocks + b] = d;
      if (q->xsum) q->xsum[r * blocks + b] = sum;
    }
}

/* A block's 32-bit integer sums of a group's rows added to their float32 totals, the same
 * operations in the same order in either build: y = fma(dw * dx, sum, y), then (Q4_1, ``m``
 * not NULL) y = fma(mw, sum(x), y). ``d`` and ``m``: the block's scales of the panel. */
static inline __attribute__((always_inline)) void add_block(
    const int rows, const Quantized *x, const int64_t blocks, const int64_t b, const uint16_t *d,
    const uint16_t *m, const ivec *slo, const ivec *shi, vec *lo, vec *hi) {
  const vec d_lo = vhalf(d), d_hi = vhalf(d + VW);
  for (int r = 0; r < rows; ++r) {
    const vec dx = vset1(x->dx[r * blocks + b]);
    lo[r] = vfma(vmul(d_lo, dx), vint(slo[r]), lo[r]);
    hi[r] = vfma(vmul(d_hi, dx), vint(shi[r]), hi[r]);
    if (m) {
      const vec xs = vset1(x->xsum[r * blocks + b]);
      lo[r] = vfma(vhalf(m), xs, lo[r]);
      hi[r] = vfma(vhalf(m + VW), xs, hi[r]);
    }
  }
}

/* 4 bytes of a row of qx (4 int8 inputs, or 2 int16 in XSLOT's order), broadcast to every lane */
static inline ivec broadcast4(const xq_t *p) {
  int32_t v;
  memcpy(&v, p, sizeof v);
  return iset1(v);
}

/* The sums of one block b of a group's rows (32-bit lanes, slo / shi: the panel's two halves of
 * outputs), from the block's packed weights q, by format and build. */
#ifdef KVGATE_X16
/* A 32-bit lane of a block's sum takes 32 products of at most 15 * 32767: no overflow. The
 * lane's 16-bit halves hold bytes (0, 1) and (2, 3): the low nibbles of bytes 0 and 2 are inputs
 * 8c + 0 and 8c + 2, and so on, each set meeting its XSLOT pair of x. */
static inline __attribute__((always_inline)) void q4_1_sums(
    const int rows, const Quantized *x, const int64_t k, const int64_t b, const uint8_t *q,
    ivec *slo, ivec *shi) {
  const ivec nibble = iset1_16(15);
  for (int r = 0; r < rows; ++r) slo[r] = shi[r] = izero();
  for (int c = 0; c < 4; ++c) {
    const ivec wl = iload(q + c * PANEL * 4), wh = iload(q + c * PANEL * 4 + VW * 4);
    const ivec l02 = iand(wl, nibble), l13 = iand(isrl16(wl, 8), nibble);
    const ivec l46 = iand(isrl16(wl, 4), nibble), l57 = isrl16(wl, 12);
    const ivec h02 = iand(wh, nibble), h13 = iand(isrl16(wh, 8), nibble);
    const ivec h46 = iand(isrl16(wh, 4), nibble), h57 = isrl16(wh, 12);
    for (int r = 0; r < rows; ++r) {
      const int16_t *xq = x->qx + r * k + b * QBLOCK + 8 * c;
      const ivec x02 = broadcast4(xq), x13 = broadcast4(xq + 2);
      const ivec x46 = broadcast4(xq + 4), x57 = broadcast4(xq + 6);
      slo[r] = iadd32(slo[r], iadd32(iadd32(imadd(l02, x02), imadd(l13, x13)),
                                     iadd32(imadd(l46, x46), imadd(l57, x57))));
      shi[r] = iadd32(shi[r], iadd32(iadd32(imadd(h02, x02), imadd(h13, x13)),
                                     iadd32(imadd(h46, x46), imadd(h57, x57))));
    }
  }
}

/* Signed weights, bytes 0 and 2 and bytes 1 and 3 of a lane sign-extended to 16 bits; a 32-bit
 * lane of a block's sum takes 32 products of at most 128 * 32767: no overflow. */
static inline __attribute__((always_inline)) void q8_0_sums(
    const int rows, const Quantized *x, const int64_t k, const int64_t b, const int8_t *q,
    ivec *slo, ivec *shi) {
  for (int r = 0; r < rows; ++r) slo[r] = shi[r] = izero();
  for (int c = 0; c < 8; ++c) {
    const ivec wl = iload(q + c * PANEL * 4), wh = iload(q + c * PANEL * 4 + VW * 4);
    const ivec l02 = isra16(isll16(wl, 8), 8), l13 = isra16(wl, 8);
    const ivec h02 = isra16(isll16(wh, 8), 8), h13 = isra16(wh, 8);
    for (int r = 0; r < rows; ++r) {
      const int16_t *xq = x->qx + r * k + b * QBLOCK + 4 * c;
      const ivec x02 = broadcast4(xq), x13 = broadcast4(xq + 2);
      slo[r] = iadd32(slo[r], iadd32(imadd(l02, x02), imadd(l13, x13)));
      shi[r] = iadd32(shi[r], iadd32(imadd(h02, x02), imadd(h13, x13)));
    }
  }
}

#else
/* Each 16-bit lane of a block's sum takes 16 products of at most 15 * 127: no overflow; the
 * sums go to 32 bits at the block's end. */
static inline __attribute__((always_inline)) void q4_1_sums(
    const int rows, const Quantized *x, const int64_t k, const int64_t b, const uint8_t *q,
    ivec *slo, ivec *shi) {
  const ivec nibble = iset1_8(15), ones = iset1_16(1);
  for (int r = 0; r < rows; ++r) slo[r] = shi[r] = izero();
  for (int c = 0; c < 4; ++c) {
    const ivec wl = iload(q + c * PANEL * 4), wh = iload(q + c * PANEL * 4 + VW * 4);
    const ivec l0 = iand(wl, nibble), l1 = iand(isrl16(wl, 4), nibble);
    const ivec h0 = iand(wh, nibble), h1 = iand(isrl16(wh, 4), nibble);
    for (int r = 0; r < rows; ++r) {
      const int8_t *xq = x->qx + r * k + b * QBLOCK + 8 * c;
      const ivec x0 = broadcast4(xq), x1 = broadcast4(xq + 4);
      slo[r] = iadd16(slo[r], iadd16(imaddubs(l0, x0), imaddubs(l1, x1)));
      shi[r] = iadd16(shi[r], iadd16(imaddubs(h0, x0), imaddubs(h1, x1)));
    }
  }
  for (int r = 0; r < rows; ++r) {
    slo[r] = imadd(slo[r], ones);
    shi[r] = imadd(shi[r], ones);
  }
}

/* Signed weights: |w| (unsigned) times x with w's sign; a 16-bit lane holds 2 products of at
 * most 128 * 127, so each part goes to 32 bits at once. */
static inline __attribute__((always_inline)) void q8_0_sums(
    const int rows, const Quantized *x, const int64_t k, const int64_t b, const int8_t *q,
    ivec *slo, ivec *shi) {
  const ivec ones = iset1_16(1);
  for (int r = 0; r < rows; ++r) slo[r] = shi[r] = izero();
  for (int c = 0; c < 8; ++c) {
    const ivec wl = iload(q + c * PANEL * 4), wh = iload(q + c * PANEL * 4 + VW * 4);
    const ivec al = iabs8(wl), ah = iabs8(wh);
    for (int r = 0; r < rows; ++r) {
      const ivec xv = broadcast4(x->qx + r * k + b * QBLOCK + 4 * c);
      slo[r] = iadd32(slo[r], imadd(imaddubs(al, isign8(xv, wl)), ones));
      shi[r] = iadd32(shi[r], imadd(imaddubs(ah, isign8(xv, wh)), ones));
    }
  }
}

#endif

/* One group of rows against one panel: each block's sums, scaled into the float32 totals
 * (``q4``, a constant at each call: Q4_1's layout and offset, else Q8_0's), then stored. */
static inline __attribute__((always_inline)) void group(
    const int rows, const int q4, const Quantized *x, const int64_t k, const void *qs,
    const uint16_t *scales, float *y, const int64_t n, const int64_t cols, const float *bias) {
  const int64_t blocks = k / QBLOCK;
  vec lo[GROUP], hi[GROUP];
  for (int r = 0; r < rows; ++r) lo[r] = hi[r] = vzero();
  for (int64_t b = 0; b < blocks; ++b) {
    ivec slo[GROUP], shi[GROUP];
    if (q4) {
      q4_1_sums(rows, x, k, b, (const uint8_t *)qs + b * 4 * PANEL * 4, slo, shi);
      const uint16_t *s = scales + b * 2 * PANEL;
      add_block(rows, x, blocks, b, s, s + PANEL, slo, shi, lo, hi);
    } else {
      q8_0_sums(rows, x, k, b, (const int8_t *)qs + b * 8 * PANEL * 4, slo, shi);
      add_block(rows, x, blocks, b, scales + b * PANEL, 0, slo, shi, lo, hi);
    }
  }
  store_group(rows, lo, hi, y, n, cols, bias);
}

#define Q4_CALL(R) group(R, 1, &xr, k, q, sc, yr, n, cols, b)
#define Q8_CALL(R) group(R, 0, &xr, k, q, sc, yr, n, cols, b)

/* Panels [p0, p1) over quantized rows (``x->xsum`` NULL: Q8_0). */
static void block_gemm(const Quantized *x, int64_t m, int64_t k, const void *qs,
                       const uint16_t *scales, int64_t n, const float *bias, float *out,
                       int64_t p0, int64_t p1) {
  const int64_t blocks = k / QBLOCK, q4 = x->xsum != 0;
  const int64_t q_panel = k * (q4 ? PANEL / 2 : PANEL);
  const int64_t s_panel = blocks * (q4 ? 2 * PANEL : PANEL);
  for (int64_t rb = 0; rb < m; rb += ROWBLOCK) {
    const int64_t rb_end = m - rb < ROWBLOCK ? m : rb + ROWBLOCK;
    const int64_t groups = (rb_end - rb + GROUP - 1) / GROUP;
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t *q = (const uint8_t *)qs + p * q_panel;
      const uint16_t *sc = scales + p * s_panel;
      const int64_t col0 = p * PANEL;
      const int64_t cols = n - col0 < PANEL ? n - col0 : PANEL;
      const float *b = bias ? bias + col0 : 0;
      for (int64_t g = 0, r0 = rb; g < groups; ++g) {
        const int64_t rows = group_rows(rb_end - r0, groups - g);
        const Quantized xr = {x->qx + r0 * k, x->dx + r0 * blocks,
                              q4 ? x->xsum + r0 * blocks : 0};
        float *yr = out + r0 * n + col0;
        if (q4) GROUP_SWITCH(rows, Q4_CALL)
        else GROUP_SWITCH(rows, Q8_CALL)
        r0 += rows;
      }
    }
  }
}

/* ---- Calls, split over panels on qgemm.c's thread pool (its kvgate_parallel_for) ---- */

typedef int (*task_fn)(const void *ctx, int64_t p0, int64_t p1);
typedef int (*parallel_fn)(task_fn fn, const void *ctx, int64_t items, int threads);

static parallel_fn parallel; /* set once by kvgate_q8gemm_use_pool (q16: its own) first */

void NAME(kvgate, gemm_use_pool)(parallel_fn fn) { parallel = fn; }

typedef struct {
  Quantized x;
  const float *bias;
  float *out;
  const void *qs;
  const uint16_t *scales;
  int64_t m, k, n;
} GemmCall;

static int panels_task(const void *ctx, int64_t p0, int64_t p1) {
  const GemmCall *c = ctx;
  block_gemm(&c->x, c->m, c->k, c->qs, c->scales, c->n, c->bias, c->out, p0, p1);
  return 0;
}

static int gemm(const float *x, int64_t m, int64_t k, const void *qs, const uint16_t *scales,
                int64_t n, const float *bias, float *out, int64_t panels, int threads, int q4) {
  const int64_t blocks = k / QBLOCK;
  void *scratch = malloc(sizeof(xq_t) * (size_t)(m * k) + sizeof(float) * (size_t)(2 * m * blocks));
  if (!scratch) return -1;
  float *dx = scratch;
  const Quantized q = {(xq_t *)(dx + 2 * m * blocks), dx, q4 ? dx + m * blocks : 0};
  quantize_rows(x, m, k, &q);
  const GemmCall c = {q, bias, out, qs, scales, m, k, n};
  const int status = parallel ? parallel(panels_task, &c, panels, threads)
                              : panels_task(&c, 0, panels);
  free(scratch);
  return status;
}

/* The signature of qgemm.c's kvgate_*_gemm_threads. Returns 0, or -1 without memory. */
int NAME(kvgate_q4_1, _gemm_threads)(const float *x, int64_t m, int64_t k, const uint8_t *qs,
                                const uint16_t *dm, int64_t n, const float *bias, float *out,
                                int64_t panels, int threads) {
  return gemm(x, m, k, qs, dm, n, bias, out, panels, threads, 1);
}

int NAME(kvgate_q8_0, _gemm_threads)(const float *x, int64_t m, int64_t k, const int8_t *qs,
                                const uint16_t *d, int64_t n, const float *bias, float *out,
                                int64_t panels, int threads) {
  return gemm(x, m, k, qs, d, n, bias, out, panels, threads, 0);
}
