/* y[m, n] = x[m, k] . W[n, k]^T (+ bias): float32, AVX-512, one thread per call.
 *
 * W is packed once into panels of 32 output columns, [ceil(n / 32)][k][32] (zero-padded), so a
 * panel streams from memory in one sequential pass. For each k, two 16-float vectors of the panel
 * are multiplied into the accumulators of up to 8 rows (16 zmm registers); rows beyond 8 are done
 * in further groups while the panel is still in cache. Each output sums k in blocks of 512 (a
 * fused multiply-add chain in registers per block, then added to the output), which bounds rounding
 * growth on long rows. The order of every sum is the same whatever m is, so a row's result does not
 * depend on the rows computed with it.
 *
 * Rows are taken 128 at a time, so a block of x stays in cache while every panel streams past it.
 * The caller splits the panel range [p0, p1) across threads.
 */
#include <immintrin.h>
#include <stdint.h>

#define PANEL 32
#define GROUP 8
#define ROWBLOCK 128
#define KBLOCK 512

static inline __attribute__((always_inline)) void panel_group(
    const int rows, const float *x, const int64_t k, const float *w, const int64_t k0,
    const int64_t k1, float *y, const int64_t n, const int64_t cols, const float *bias) {
  __m512 lo[GROUP], hi[GROUP];
  for (int r = 0; r < rows; ++r) {
    lo[r] = _mm512_setzero_ps();
    hi[r] = _mm512_setzero_ps();
  }
  for (int64_t i = k0; i < k1; ++i) {
    const __m512 w_lo = _mm512_loadu_ps(w + i * PANEL);
    const __m512 w_hi = _mm512_loadu_ps(w + i * PANEL + 16);
    for (int r = 0; r < rows; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * k + i]);
      lo[r] = _mm512_fmadd_ps(xb, w_lo, lo[r]);
      hi[r] = _mm512_fmadd_ps(xb, w_hi, hi[r]);
    }
  }
  if (cols == PANEL) {
    /* full panel: plain loads and stores, which forward from the previous block's stores */
    for (int r = 0; r < rows; ++r) {
      const float *base = k0 == 0 ? bias : y + r * n;
      const __m512 s_lo = base ? _mm512_loadu_ps(base) : _mm512_setzero_ps();
      const __m512 s_hi = base ? _mm512_loadu_ps(base + 16) : _mm512_setzero_ps();
      _mm512_storeu_ps(y + r * n, _mm512_add_ps(s_lo, lo[r]));
      _mm512_storeu_ps(y + r * n + 16, _mm512_add_ps(s_hi, hi[r]));
    }
    return;
  }
  const __mmask16 m_lo = cols >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1u);
  const __mmask16 m_hi = cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1u);
  for (int r = 0; r < rows; ++r) {
    /* the first block starts from the bias (or zero), later ones from the partial sums */
    const float *base = k0 == 0 ? bias : y + r * n;
    const __m512 s_lo = base ? _mm512_maskz_loadu_ps(m_lo, base) : _mm512_setzero_ps();
    const __m512 s_hi = base ? _mm512_maskz_loadu_ps(m_hi, base + 16) : _mm512_setzero_ps();
    _mm512_mask_storeu_ps(y + r * n, m_lo, _mm512_add_ps(s_lo, lo[r]));
    _mm512_mask_storeu_ps(y + r * n + 16, m_hi, _mm512_add_ps(s_hi, hi[r]));
  }
}

#define GROUP_CASE(R)                                \
  case R:                                            \
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
      for (int64_t r0 = rb; r0 < rb_end; r0 += GROUP) {
        const float *xg = x + r0 * k;
        float *yg = out + r0 * n + col0;
        for (int64_t k0 = 0; k0 < k; k0 += KBLOCK) {
          const int64_t k1 = k - k0 < KBLOCK ? k : k0 + KBLOCK;
          switch (rb_end - r0 < GROUP ? rb_end - r0 : GROUP) {
            GROUP_CASE(1)
            GROUP_CASE(2)
            GROUP_CASE(3)
            GROUP_CASE(4)
            GROUP_CASE(5)
            GROUP_CASE(6)
            GROUP_CASE(7)
            GROUP_CASE(8)
          }
        }
      }
    }
  }
}
