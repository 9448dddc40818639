/* y[m, n] = x[m, k] . W[n, k]^T (+ bias): float32, one thread per call; AVX-512 or AVX2 + FMA.
 *
 * W is packed once into panels of PANEL output columns (two vectors), [ceil(n / PANEL)][k][PANEL]
 * (zero-padded), so a panel streams from memory in one sequential pass. For each k, the two
 * vectors of the panel are multiplied into the accumulators of up to GROUP rows (2 * GROUP vector
 * registers); more rows are split evenly into further groups while the panel is still in cache.
 * Each output sums k in blocks of 512 (a fused multiply-add chain in registers per block, then
 * added to the output), which bounds rounding growth on long rows. The order of every sum is the
 * same whatever m is, so a row's result does not depend on the rows computed with it.
 *
 * Rows are taken 128 at a time, so a block of x stays in cache while every panel streams past it.
 * The caller splits the panel range [p0, p1) across threads.
 */
#include <immintrin.h>
#include <stdint.h>

#if defined(__AVX512F__)
typedef __m512 vec;
#define VW 16
#define GROUP 8 /* 16 accumulators of 32 registers */
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vset1 _mm512_set1_ps
#define vzero _mm512_setzero_ps
#define vfma _mm512_fmadd_ps
#define vadd _mm512_add_ps
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vec;
#define VW 8
#define GROUP 6 /* 12 accumulators + 2 panel vectors + 1 broadcast of 16 registers */
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vset1 _mm256_set1_ps
#define vzero _mm256_setzero_ps
#define vfma _mm256_fmadd_ps
#define vadd _mm256_add_ps
#else
#error "gemm.c needs AVX-512F, or AVX2 with FMA"
#endif

#define PANEL (2 * VW)
#define ROWBLOCK 128
#define KBLOCK 512

int kvgate_gemm_panel(void) { return PANEL; }

static inline __attribute__((always_inline)) void panel_group(
    const int rows, const float *x, const int64_t k, const float *w, const int64_t k0,
    const int64_t k1, float *y, const int64_t n, const int64_t cols, const float *bias) {
  vec lo[GROUP], hi[GROUP];
  for (int r = 0; r < rows; ++r) {
    lo[r] = vzero();
    hi[r] = vzero();
  }
  for (int64_t i = k0; i < k1; ++i) {
    const vec w_lo = vload(w + i * PANEL);
    const vec w_hi = vload(w + i * PANEL + VW);
    for (int r = 0; r < rows; ++r) {
      const vec xb = vset1(x[r * k + i]);
      lo[r] = vfma(xb, w_lo, lo[r]);
      hi[r] = vfma(xb, w_hi, hi[r]);
    }
  }
  /* the first block starts from the bias (or zero), later ones from the partial sums */
  if (cols == PANEL) {
    for (int r = 0; r < rows; ++r) {
      const float *base = k0 == 0 ? bias : y + r * n;
      const vec s_lo = base ? vload(base) : vzero();
      const vec s_hi = base ? vload(base + VW) : vzero();
      vstore(y + r * n, vadd(s_lo, lo[r]));
      vstore(y + r * n + VW, vadd(s_hi, hi[r]));
    }
    return;
  }
  /* the last, partial panel: the same additions, element by element */
  float sums[PANEL];
  for (int r = 0; r < rows; ++r) {
    vstore(sums, lo[r]);
    vstore(sums + VW, hi[r]);
    float *out = y + r * n;
    for (int64_t c = 0; c < cols; ++c) {
      const float base = k0 == 0 ? (bias ? bias[c] : 0.0f) : out[c];
      out[c] = base + sums[c];
    }
  }
}

#define GROUP_CASE(R)                                 \
  case R:                                             \
    panel_group(R, xg, k, w, k0, k1, yg, n, cols, b); \
    break;

void kvgate_gemm(const float *x, int64_t m, int64_t k, const float *packed, int64_t n,
                 const float *bias, float *out, int64_t p0, int64_t p1) {
  for (int64_t rb = 0; rb < m; rb += ROWBLOCK) {
    const int64_t rb_end = m - rb < ROWBLOCK ? m : rb + ROWBLOCK;
    for (int64_t p = p0; p < p1; ++p) {
      const float *w = packed + p * k * PANEL;
      const int64_t col0 = p * PANEL;
      const int64_t cols = n - col0 < PANEL ? n - col0 : PANEL;
      const float *b = bias ? bias + col0 : 0;
      /* rows split evenly over the fewest groups (8 rows on AVX2: 4 + 4, not 6 + 2) */
      const int64_t groups = (rb_end - rb + GROUP - 1) / GROUP;
      for (int64_t g = 0, r0 = rb; g < groups; ++g) {
        const int64_t rows = (rb_end - r0 + (groups - g) - 1) / (groups - g);
        const float *xg = x + r0 * k;
        float *yg = out + r0 * n + col0;
        r0 += rows;
        for (int64_t k0 = 0; k0 < k; k0 += KBLOCK) {
          const int64_t k1 = k - k0 < KBLOCK ? k : k0 + KBLOCK;
          switch (rows) {
            GROUP_CASE(1)
            GROUP_CASE(2)
            GROUP_CASE(3)
            GROUP_CASE(4)
            GROUP_CASE(5)
            GROUP_CASE(6)
#if GROUP > 6
            GROUP_CASE(7)
            GROUP_CASE(8)
#endif
          }
        }
      }
    }
  }
}
