/* Every decoder layer of one forward in one call: the same kernels, in the same order, that the
 * per-op path (engine/runtime/model/decoder.py) calls one by one from Python, so the two give the
 * same bits. Per layer: RMSNorm (+ the previous layer's MLP output into the residual stream),
 * the fused QKV block GEMM, RoPE + the K/V store, attention through the block tables, the output
 * projection, RMSNorm (+ the attention output), the fused gate/up GEMM, SiLU(gate) * up and the
 * down projection.
 *
 * The kernels live in other libraries (qgemm.c, ops.c, attention.c) and arrive as function
 * pointers (Kernels), so there is one thread pool (qgemm.c's) and one copy of each kernel. Thread
 * counts follow the rules of the Python wrappers (qgemm.py, ops.py): a kernel below its work
 * threshold runs on one thread; no result depends on the thread count. */
#include <stddef.h>
#include <stdint.h>

#define GEMM_SPLIT_MACS (1LL << 18) /* qgemm.py's _MIN_SPLIT_MACS */
#define ATTENTION_SPLIT_MACS (1LL << 18) /* ops.py's _MIN_SPLIT_MACS */

typedef int (*gemm_fn)(const float *x, int64_t m, int64_t k, const void *qs,
                       const uint16_t *scales, int64_t n, const float *bias, float *out,
                       int64_t panels, int threads);
typedef void (*norm_fn)(const float *x, float *residual, const float *w, float eps, int64_t rows,
                        int64_t hidden, float *out);
typedef void (*rope_fn)(float *qkv, int64_t row_stride, int64_t tokens, int64_t hq, int64_t hkv,
                        int64_t d, const int64_t *positions, const float *cos, const float *sin,
                        float *k_cache, float *v_cache, const int64_t *slots);
typedef void (*silu_fn)(const float *gate_up, int64_t rows, int64_t inter, float *out);
typedef int (*parallel_fn)(int (*task)(const void *, int64_t, int64_t), const void *ctx,
                           int64_t items, int threads);
typedef int (*attention_fn)(const float *q, int64_t q_row_stride, const float *k_cache,
                            const float *v_cache, const int32_t *tables, int64_t table_stride,
                            const int32_t *starts, const int32_t *ctx, int64_t hq, int64_t hkv,
                            int64_t d, int64_t bs, int64_t max_len, float scale, float *out,
                            int64_t seqs, parallel_fn parallel, int threads);

typedef struct {
  gemm_fn gemm[6]; /* by Linear.kind (qgemm.py's KINDS): Q4_1, Q8_0, both on int8 x, both on int16 x */
  norm_fn rms_norm;
  rope_fn rope_store_kv;
  silu_fn silu_mul;
  attention_fn attention;
  parallel_fn parallel;
} Kernels;

typedef struct { /* a weight packed by qgemm.py */
  int64_t kind, n, k, panels;
  const void *qs;
  const uint16_t *scales;
  const float *bias; /* or NULL */
} Linear;

typedef struct {
  const float *input_norm, *post_norm;
  Linear qkv, o, gate_up, down;
  float *k_cache, *v_cache;
} Layer;

typedef struct {
  int64_t tokens, hidden, hq, hkv, d, inter;
  float eps, scale;
  int threads;
  const int64_t *positions, *slots;
  const float *cos, *sin;
  const int32_t *tables, *starts, *ctx;
  int64_t table_stride, block_size, max_len, seqs;
  /* the residual stream [T][hidden] (in: the embeddings; out: before the last MLP output) and
   * the last layer's MLP output [T][hidden] */
  float *x, *delta;
  /* scratch: normed [T][hidden], qkv [T][(hq + 2 hkv) d], attention [T][hq d], gate/up
   * [T][2 inter], activation [T][inter] */
  float *h, *qkv, *attn, *gate_up, *act;
} Step;

static int linear(const Kernels *kn, const Linear *w, const float *x, int64_t m, float *out,
                  int threads) {
  const int t = m * w->n * w->k >= GEMM_SPLIT_MACS ? threads : 1;
  return kn->gemm[w->kind](x, m, w->k, w->qs, w->scales, w->n, w->bias, out, w->panels, t);
}

static int layer(const Kernels *kn, const Layer *l, const Step *s, int first) {
  const int64_t t = s->tokens, width = (s->hq + 2 * s->hkv) * s->d;
  if (first) kn->rms_norm(s->x, NULL, l->input_norm, s->eps, t, s->hidden, s->h);
  else kn->rms_norm(s->delta, s->x, l->input_norm, s->eps, t, s->hidden, s->h);
  if (linear(kn, &l->qkv, s->h, t, s->qkv, s->threads)) return -1;
  kn->rope_store_kv(s->qkv, width, t, s->hq, s->hkv, s->d, s->positions, s->cos, s->sin,
                    l->k_cache, l->v_cache, s->slots);
  const int at = t * s->hq * s->max_len * s->d >= ATTENTION_SPLIT_MACS ? s->threads : 1;
  if (kn->attention(s->qkv, width, l->k_cache, l->v_cache, s->tables, s->table_stride, s->starts,
                    s->ctx, s->hq, s->hkv, s->d, s->block_size, s->max_len, s->scale, s->attn,
                    s->seqs, kn->parallel, at))
    return -1;
  if (linear(kn, &l->o, s->attn, t, s->delta, s->threads)) return -1;
  kn->rms_norm(s->delta, s->x, l->post_norm, s->eps, t, s->hidden, s->h);
  if (linear(kn, &l->gate_up, s->h, t, s->gate_up, s->threads)) return -1;
  kn->silu_mul(s->gate_up, t, s->inter, s->act);
  return linear(kn, &l->down, s->act, t, s->delta, s->threads);
}

/* Layers [0, n) over one step. Returns 0, or -1 where a kernel had no memory. */
int kvgate_decoder_layers(const Layer *layers, int64_t n, const Step *s, const Kernels *kn) {
  for (int64_t i = 0; i < n; ++i)
    if (layer(kn, &layers[i], s, i == 0)) return -1;
  return 0;
}
