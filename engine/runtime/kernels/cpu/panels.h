/* What the block GEMMs (qgemm.c: float32 activations, q8gemm.c: int8 activations) share: the
 * float32 vectors of the build's ISA, the panel geometry (PANEL = two vectors of outputs), the
 * store of a group's sums and the switch that makes a group's row count a constant. */
#ifndef KVGATE_PANELS_H
#define KVGATE_PANELS_H

#include <immintrin.h>
#include <stdint.h>

#if defined(__AVX512F__)
typedef __m512 vec;
typedef __m512i ivec;
#define VW 16
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vset1 _mm512_set1_ps
#define vzero _mm512_setzero_ps
#define vfma _mm512_fmadd_ps
#define vadd _mm512_add_ps
#define vmul _mm512_mul_ps
#define vint _mm512_cvtepi32_ps
#define vhalf(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
typedef __m256 vec;
typedef __m256i ivec;
#define VW 8
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vset1 _mm256_set1_ps
#define vzero _mm256_setzero_ps
#define vfma _mm256_fmadd_ps
#define vadd _mm256_add_ps
#define vmul _mm256_mul_ps
#define vint _mm256_cvtepi32_ps
#define vhalf(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#else
#error "the block GEMMs need AVX-512F, or AVX2 with FMA and F16C"
#endif

#define PANEL (2 * VW)
#define QBLOCK 32
#define ROWBLOCK 128 /* rows of x kept in cache while every panel streams past them */

/* The outputs of one group of rows for one panel, stored (plus bias) into y. */
static inline __attribute__((always_inline)) void store_group(
    const int rows, vec *lo, vec *hi, float *y, const int64_t n, const int64_t cols,
    const float *bias) {
  if (cols == PANEL) {
    const vec b_lo = bias ? vload(bias) : vzero();
    const vec b_hi = bias ? vload(bias + VW) : vzero();
    for (int r = 0; r < rows; ++r) {
      vstore(y + r * n, vadd(b_lo, lo[r]));
      vstore(y + r * n + VW, vadd(b_hi, hi[r]));
    }
    return;
  }
  float sums[PANEL];
  for (int r = 0; r < rows; ++r) {
    vstore(sums, lo[r]);
    vstore(sums + VW, hi[r]);
    for (int64_t c = 0; c < cols; ++c) y[r * n + c] = (bias ? bias[c] : 0.0f) + sums[c];
  }
}

/* Rows split evenly over the fewest groups. */
static inline int64_t group_rows(const int64_t left, const int64_t groups_left) {
  return (left + groups_left - 1) / groups_left;
}

/* CALL(R) with R the constant equal to ``rows`` (1 to 3, or 1 to 6) */
#define GROUP_CASE(R, CALL) \
  case R:                   \
    CALL;                   \
    break;
#define SWITCH_3(rows, CALL) \
  switch (rows) { GROUP_CASE(1, CALL(1)) GROUP_CASE(2, CALL(2)) GROUP_CASE(3, CALL(3)) }
#define SWITCH_6(rows, CALL)                                                            \
  switch (rows) {                                                                       \
    GROUP_CASE(1, CALL(1)) GROUP_CASE(2, CALL(2)) GROUP_CASE(3, CALL(3))                \
    GROUP_CASE(4, CALL(4)) GROUP_CASE(5, CALL(5)) GROUP_CASE(6, CALL(6))                \
  }

#endif
