/* The per-layer ops of a CPU decode step in float32, each one pass with no temporaries: RMSNorm
 * (with the residual add fused), RoPE with the K/V cache store and the MLP's SiLU(gate) * up. One
 * call does what torch does
 * in 10-30 dispatches; attention is attention.c.
 *
 * Reductions accumulate in LANES independent partial sums combined in a fixed order, so the
 * compiler vectorizes them without reassociating and the AVX2 and AVX-512 builds give the same
 * bits. Layouts are engine/runtime/kernels/metadata.py's:
 *   k_cache, v_cache [blocks][block_size][kv_heads][head_dim], slot = block * block_size + offset.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16

static float sum_lanes(const float *acc) {
  float s = 0.0f;
  for (int j = 0; j < LANES; ++j) s += acc[j];
  return s;
}

static float dot(const float *a, const float *b, int64_t n) {
  float acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return sum_lanes(acc);
}

/* out[r] = rmsnorm(x[r] (+ residual[r])) * w; with a residual, it is overwritten by the sum. */
void kvgate_rms_norm(const float *x, float *residual, const float *w, float eps, int64_t rows,
                     int64_t hidden, float *out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *src = x + r * hidden;
    if (residual) {
      float *res = residual + r * hidden;
      for (int64_t i = 0; i < hidden; ++i) res[i] += src[i];
      src = res;
    }
    const float inv = 1.0f / sqrtf(dot(src, src, hidden) / (float)hidden + eps);
    float *dst = out + r * hidden;
    for (int64_t i = 0; i < hidden; ++i) dst[i] = src[i] * inv * w[i];
  }
}

/* HF's rotate_half RoPE of one head in place: x * cos + rotate_half(x) * sin. */
static void rotate(float *x, const float *c, const float *s, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c[i] - x2 * s[i];
    x[i + half] = x2 * c[i + half] + x1 * s[i + half];
  }
}

/* Rows t of q/k/v start at qkv + t * row_stride: q heads, then k heads, then v heads, each d
 * floats. q and k are rotated in place; k and v are copied into their cache slots. */
void kvgate_rope_store_kv(float *qkv, int64_t row_stride, int64_t tokens, int64_t hq, int64_t hkv,
                          int64_t d, const int64_t *positions, const float *cos, const float *sin,
                          float *k_cache, float *v_cache, const int64_t *slots) {
  for (int64_t t = 0; t < tokens; ++t) {
    float *row = qkv + t * row_stride;
    const float *c = cos + positions[t] * d, *s = sin + positions[t] * d;
    for (int64_t h = 0; h < hq + hkv; ++h) rotate(row + h * d, c, s, d);
    const int64_t at = slots[t] * hkv * d;
    memcpy(k_cache + at, row + hq * d, sizeof(float) * (size_t)(hkv * d));
    memcpy(v_cache + at, row + (hq + hkv) * d, sizeof(float) * (size_t)(hkv * d));
  }
}

/* exp(x) for one float, written so that a loop of them vectorizes (no call, no branch):
 * Cephes' expf (~1 ulp), x clamped to [-87, 88] (the normal floats' range); n = x / ln 2 is
 * rounded to nearest by the 1.5 * 2^23 trick, which also leaves n's integer in the low bits. */
static inline float exp_clamped(float x) {
  const float magic = 12582912.0f; /* 1.5 * 2^23 */
  x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
  const float shifted = fmaf(x, 1.44269504088896341f, magic);
  const float n = shifted - magic;
  x = fmaf(n, 2.12194440e-4f, fmaf(n, -0.693359375f, x));
  float p = 1.9875691500e-4f;
  p = fmaf(p, x, 1.3981999507e-3f);
  p = fmaf(p, x, 8.3334519073e-3f);
  p = fmaf(p, x, 4.1665795894e-2f);
  p = fmaf(p, x, 1.6666665459e-1f);
  p = fmaf(p, x, 5.0000001201e-1f);
  p = fmaf(p, x * x, x + 1.0f);
  int32_t bits;
  memcpy(&bits, &shifted, sizeof bits);
  bits = (bits - 0x4b400000 + 127) << 23; /* 2^n: n from shifted's mantissa */
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/* out[r][i] = silu(gate_up[r][i]) * gate_up[r][inter + i]: the MLP activation of the fused
 * gate/up projection's rows [gate | up]. */
void kvgate_silu_mul(const float *gate_up, int64_t rows, int64_t inter, float *out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *g = gate_up + r * 2 * inter, *u = g + inter;
    float *dst = out + r * inter;
    for (int64_t i = 0; i < inter; ++i) dst[i] = g[i] / (1.0f + exp_clamped(-g[i])) * u[i];
  }
}
