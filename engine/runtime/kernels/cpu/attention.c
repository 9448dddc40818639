/* Causal attention of float32 query rows over a paged K/V cache, on the CPU: decode rows and
 * prefill/extend chunks alike. Row t of request r (rows starts[r] .. starts[r + 1] - 1) sees keys
 * 0 .. ctx[r] + (t - starts[r]) of its block table. Layouts are engine/runtime/kernels/metadata.py's:
 *   k_cache, v_cache [blocks][block_size][kv_heads][head_dim], slot = block * block_size + offset.
 *
 * A work item is a row tile: up to TILE_ROWS consecutive rows of a request (prefill chunks;
 * a decode row alone) with all their heads, at most MAX_ROW_HEADS (row, head) pairs; with more
 * heads than that, a tile of up to TILE_ROWS rows (or decode-row heads) of one kv head. A row
 * tile's scores read each cached key row whole, every kv head at once (one kv head's slice of
 * rows kv_heads * d floats apart, read once per kv head, ran at a third of the speed on the
 * same bytes); a decode row's values too, a chunk's per head with its rows in registers. Each
 * key and value is loaded once for a tile, and the (row, head) sums are independent chains: the
 * scores go 3 queries x 2 keys at a time, so each load feeds two or three FMAs. Per
 * row and head, three passes: scores q . k (a fixed 16-lane tree per key), exp of score minus the
 * row's maximum with their total (16 lanes by key index, the same tree), and the weighted sum of
 * values in key order. Every sum runs in an order fixed by the row alone, so a row's result does
 * not depend on its tile, batch, thread count or ISA: the AVX2 and AVX-512 builds give the same
 * bits (a 16-lane sum is one AVX-512 vector or two AVX2 ones).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX512F__)
#define VW 16
typedef __m512 vec;
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vset1 _mm512_set1_ps
#define vzero _mm512_setzero_ps
#define vfma _mm512_fmadd_ps
#define vadd _mm512_add_ps
#define vmul _mm512_mul_ps
#define vmax _mm512_max_ps
#define vsub _mm512_sub_ps
/* r where x >= lo, else 0 */
#define vkeep(x, lo, r) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), r)
#define vfloor(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
#define vpow2i(n) \
  _mm512_castsi512_ps(_mm512_slli_epi32( \
      _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23))
static inline __m256 half8(vec a) {
  return _mm256_add_ps(_mm512_castps512_ps256(a),
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
typedef __m256 vec;
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vset1 _mm256_set1_ps
#define vzero _mm256_setzero_ps
#define vfma _mm256_fmadd_ps
#define vadd _mm256_add_ps
#define vmul _mm256_mul_ps
#define vmax _mm256_max_ps
#define vsub _mm256_sub_ps
#define vkeep(x, lo, r) _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), r)
#define vfloor _mm256_floor_ps
#define vpow2i(n) \
  _mm256_castsi256_ps(_mm256_slli_epi32( \
      _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23))
#else
#error "attention.c needs AVX-512F, or AVX2 with FMA"
#endif

#define L16 (16 / VW) /* native vectors in 16 lanes */
#define KEYS 16       /* scores are computed, exponentiated and summed 16 at a time */
#define MAX_HEAD_DIM 256
#define TILE_ROWS 4
#define MAX_ROW_HEADS 64 /* (row, head) pairs of a row tile */
/* floats of a head's output a values pass keeps in registers for TILE_ROWS rows: 16 of 32
 * AVX-512 registers; on AVX2, 64 would be all 16 and spill (an accumulator loaded and stored
 * around each FMA) */
#define VALUES_CH (VW == 16 ? 64 : 16)
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* acc[0..15] (as L16 vectors) -> one float, by a fixed tree: 16 -> 8 -> 4 -> 2 -> 1. */
static inline float sum16(const vec *acc) {
#if VW == 16
  const __m256 s8 = half8(acc[0]);
#else
  const __m256 s8 = _mm256_add_ps(acc[0], acc[1]);
#endif
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* exp(x) lane-wise for x <= 0 (scores minus their maximum): Cephes' expf, ~1 ulp; 0 below -87
 * (where expf leaves the normal floats), so padding at -inf adds nothing. */
static inline vec vexp(const vec x0) {
  const vec lo = vset1(-87.0f);
  vec x = vmax(x0, lo);
  const vec n = vfloor(vfma(x, vset1(1.44269504088896341f), vset1(0.5f)));
  x = vfma(n, vset1(-0.693359375f), x);
  x = vfma(n, vset1(2.12194440e-4f), x);
  vec p = vset1(1.9875691500e-4f);
  p = vfma(p, x, vset1(1.3981999507e-3f));
  p = vfma(p, x, vset1(8.3334519073e-3f));
  p = vfma(p, x, vset1(4.1665795894e-2f));
  p = vfma(p, x, vset1(1.6666665459e-1f));
  p = vfma(p, x, vset1(5.0000001201e-1f));
  p = vfma(p, vmul(x, x), vadd(x, vset1(1.0f)));
  return vkeep(x0, lo, vmul(p, vpow2i(n)));
}

/* Scores (exponentiated, in place) of one query head over its padded key count; their sum. */
static float softmax_numerators(float *scores, int64_t len, int64_t padded) {
  for (int64_t j = len; j < padded; ++j) scores[j] = -INFINITY;
  vec m = vset1(-INFINITY); /* a maximum is exact in any order */
  for (int64_t j = 0; j < padded; j += VW) m = vmax(m, vload(scores + j));
  float lanes[VW], top = -INFINITY;
  vstore(lanes, m);
  for (int l = 0; l < VW; ++l) top = lanes[l] > top ? lanes[l] : top;
  const vec t = vset1(top);
  vec total[L16];
  for (int l = 0; l < L16; ++l) total[l] = vzero();
  for (int64_t j = 0; j < padded; j += KEYS)
    for (int l = 0; l < L16; ++l) {
      const vec e = vexp(vsub(vload(scores + j + l * VW), t));
      vstore(scores + j + l * VW, e);
      total[l] = vadd(total[l], e);
    }
  return sum16(total);
}

/* scores[i * s_stride] = q_i . k * scale for the n rows of a tile and one key (n a constant at
 * each call site, so the accumulators stay in registers). */
ALWAYS_INLINE void key_scores(const int n, const float *q, int64_t q_stride, const float *k,
                              int64_t d, float scale, float *scores, int64_t s_stride) {
  vec acc[TILE_ROWS][L16];
  for (int r = 0; r < n; ++r)
    for (int l = 0; l < L16; ++l) acc[r][l] = vzero();
  for (int64_t i = 0; i < d; i += 16)
    for (int l = 0; l < L16; ++l) {
      const vec kv = vload(k + i + l * VW);
      for (int r = 0; r < n; ++r)
        acc[r][l] = vfma(vload(q + r * q_stride + i + l * VW), kv, acc[r][l]);
    }
  for (int r = 0; r < n; ++r) scores[r * s_stride] = sum16(acc[r]) * scale;
}

/* The scores of nq query heads against nk consecutive key rows ``k_stride`` floats apart (nq <=
 * 3, nk <= 2, constants at each call site): out[a][j + b] = q_a . k_b * scale, by key_scores'
 * chain and tree per (query, key); each load of q or k now feeds two or three FMAs. */
ALWAYS_INLINE void pair_scores(const int nq, const int nk, const float *const *q, const float *k,
                               int64_t k_stride, int64_t d, float scale, float *const *out,
                               int64_t j) {
  vec acc[3][2][L16];
  for (int a = 0; a < nq; ++a)
    for (int b = 0; b < nk; ++b)
      for (int l = 0; l < L16; ++l) acc[a][b][l] = vzero();
  for (int64_t i = 0; i < d; i += 16)
    for (int l = 0; l < L16; ++l) {
      vec kv[2];
      for (int b = 0; b < nk; ++b) kv[b] = vload(k + b * k_stride + i + l * VW);
      for (int a = 0; a < nq; ++a) {
        const vec qv = vload(q[a] + i + l * VW);
        for (int b = 0; b < nk; ++b) acc[a][b][l] = vfma(qv, kv[b], acc[a][b][l]);
      }
    }
  for (int a = 0; a < nq; ++a)
    for (int b = 0; b < nk; ++b) out[a][j + b] = sum16(acc[a][b]) * scale;
}

static void pairs_scores(int nq, int nk, const float *const *q, const float *k, int64_t k_stride,
                         int64_t d, float scale, float *const *out, int64_t j) {
#define PAIRS(A, B) pair_scores(A, B, q, k, k_stride, d, scale, out, j)
  switch (nq * 10 + nk) {
    case 11: PAIRS(1, 1); break;
    case 12: PAIRS(1, 2); break;
    case 21: PAIRS(2, 1); break;
    case 22: PAIRS(2, 2); break;
    case 31: PAIRS(3, 1); break;
    default: PAIRS(3, 2); break;
  }
#undef PAIRS
}

/* key_scores for keys 0..len-1 of a table. */
ALWAYS_INLINE void tile_scores(const int n, const float *q, int64_t q_stride, const float *k_cache,
                               const int32_t *table, int64_t len, int64_t bs, int64_t row,
                               int64_t d, float scale, float *scores, int64_t s_stride) {
  for (int64_t b = 0, j = 0; j < len; ++b) {
    const float *kb = k_cache + (int64_t)table[b] * bs * row;
    for (const int64_t end = j + bs < len ? j + bs : len; j < end; ++j, kb += row)
      key_scores(n, q, q_stride, kb, d, scale, scores + j, s_stride);
  }
}

/* out_i = sum_j p[i][j] v_j / total_i over keys 0..len-1, CH floats of the head at a time. */
ALWAYS_INLINE void tile_values(const int n, const int ch, const float *p, int64_t p_stride,
                               const float *total, const float *v_cache, const int32_t *table,
                               int64_t len, int64_t bs, int64_t row, int64_t d, float *out,
                               int64_t out_stride) {
  for (int64_t c = 0; c < d; c += ch) {
    vec acc[TILE_ROWS][64 / VW];
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < ch / VW; ++i) acc[r][i] = vzero();
    for (int64_t b = 0, j = 0; j < len; ++b) {
      const float *vb = v_cache + (int64_t)table[b] * bs * row + c;
      for (const int64_t end = j + bs < len ? j + bs : len; j < end; ++j, vb += row)
        for (int i = 0; i < ch / VW; ++i) {
          const vec vv = vload(vb + i * VW);
          for (int r = 0; r < n; ++r) acc[r][i] = vfma(vset1(p[r * p_stride + j]), vv, acc[r][i]);
        }
    }
    for (int r = 0; r < n; ++r) {
      const vec inv = vset1(1.0f / total[r]);
      for (int i = 0; i < ch / VW; ++i)
        vstore(out + r * out_stride + c + i * VW, vmul(acc[r][i], inv));
    }
  }
}

/* A tile of n consecutive rows of one request with all hq heads (``group`` per kv head); row r
 * sees first + r keys (a decode row: n = 1). Score row (r, h) is p[(r * hq + h) * s_stride]. */
typedef struct {
  const float *q, *k_cache, *v_cache;
  const int32_t *table;
  int64_t q_stride, n, first, bs, hq, group, d;
  float scale, *out;
  int64_t out_stride;
} RowTile;

/* out[r][h] = sum_j p[r][h][j] v_j / total[r][h] over the tile's keys, each value row read whole
 * in key order: per output float the same chain of multiply-adds from zero as tile_values (a
 * future key's p is 0 and adds nothing). */
static void row_values(const RowTile *t, const float *p, int64_t p_stride, const float *total) {
  const int64_t hq = t->hq, group = t->group, d = t->d, row = hq / group * d;
  const int64_t last = t->first + t->n - 1;
  for (int64_t r = 0; r < t->n; ++r)
    for (int64_t i = 0; i < hq * d; i += VW) vstore(t->out + r * t->out_stride + i, vzero());
  for (int64_t b = 0, j = 0; j < last; ++b) {
    const float *vb = t->v_cache + (int64_t)t->table[b] * t->bs * row;
    for (const int64_t end = j + t->bs < last ? j + t->bs : last; j < end; ++j, vb += row)
      for (int64_t r = 0; r < t->n; ++r)
        for (int64_t h = 0; h < hq; ++h) {
          const vec pj = vset1(p[(r * hq + h) * p_stride + j]);
          const float *v = vb + h / group * d;
          float *o = t->out + r * t->out_stride + h * d;
          for (int64_t c = 0; c < d; c += VW) vstore(o + c, vfma(pj, vload(v + c), vload(o + c)));
        }
  }
  for (int64_t r = 0; r < t->n; ++r)
    for (int64_t h = 0; h < hq; ++h) {
      const vec inv = vset1(1.0f / total[r * hq + h]);
      float *o = t->out + r * t->out_stride + h * d;
      for (int64_t c = 0; c < d; c += VW) vstore(o + c, vmul(vload(o + c), inv));
    }
}

/* tile_values of n rows (n <= TILE_ROWS) of one head, n and the chunk width constants in each
 * branch. */
static void rows_values(int n, const float *p, int64_t p_stride, const float *total,
                        const float *v_cache, const int32_t *table, int64_t len, int64_t bs,
                        int64_t row, int64_t d, float *out, int64_t out_stride) {
#define ROWS_VALUES(N, CH) \
  tile_values(N, CH, p, p_stride, total, v_cache, table, len, bs, row, d, out, out_stride)
  switch (n * 100 + (d % VALUES_CH == 0 ? VALUES_CH : 16)) {
    case 164: ROWS_VALUES(1, 64); break;
    case 264: ROWS_VALUES(2, 64); break;
    case 364: ROWS_VALUES(3, 64); break;
    case 464: ROWS_VALUES(4, 64); break;
    case 116: ROWS_VALUES(1, 16); break;
    case 216: ROWS_VALUES(2, 16); break;
    case 316: ROWS_VALUES(3, 16); break;
    default: ROWS_VALUES(4, 16); break;
  }
#undef ROWS_VALUES
}

/* A row tile: the scores of every (row, head) from each key row read whole, each one's softmax,
 * then the values from each value row read whole; every (row, head) sum as a tile of one head
 * computes it. ``scores`` holds n * hq rows of ``s_stride`` floats. */
static void row_tile(const RowTile *t, float *scores, int64_t s_stride) {
  const int64_t hq = t->hq, group = t->group, d = t->d, hkv = hq / group, row = hkv * d;
  const int64_t last = t->first + t->n - 1, pairs = t->n * group; /* queries of a kv head */
  const float *qs[MAX_ROW_HEADS]; /* kv head g's queries at g * pairs + (r * group + h % group) */
  float *outs[MAX_ROW_HEADS];
  for (int64_t g = 0; g < hkv; ++g)
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t r = p / group, h = g * group + p % group;
      qs[g * pairs + p] = t->q + r * t->q_stride + h * d;
      outs[g * pairs + p] = scores + (r * hq + h) * s_stride;
    }
  for (int64_t b = 0, j = 0; j < last; ++b) { /* key rows read whole, two at a time */
    const float *kb = t->k_cache + (int64_t)t->table[b] * t->bs * row;
    for (const int64_t end = j + t->bs < last ? j + t->bs : last; j < end;) {
      const int nk = end - j >= 2 ? 2 : 1;
      for (int64_t g = 0; g < hkv; ++g)
        for (int64_t p = 0; p < pairs; p += 3)
          pairs_scores(pairs - p < 3 ? (int)(pairs - p) : 3, nk, qs + g * pairs + p, kb + g * d,
                       row, d, t->scale, outs + g * pairs + p, j);
      j += nk, kb += nk * row;
    }
  }
  float total[MAX_ROW_HEADS]; /* of (row r, head h) at h * n + r */
  for (int64_t r = 0; r < t->n; ++r)
    for (int64_t h = 0; h < hq; ++h) {
      float *sc = scores + (r * hq + h) * s_stride;
      const int64_t len = t->first + r, padded = (len + KEYS - 1) / KEYS * KEYS;
      total[h * t->n + r] = softmax_numerators(sc, len, padded);
      for (int64_t j = len; j < last; ++j) sc[j] = 0.0f; /* future keys */
    }
  if (t->n == 1) { /* every head's accumulators in memory, each value row read once */
    row_values(t, scores, s_stride, total);
    return;
  }
  for (int64_t h = 0; h < hq; ++h) /* the tile's rows of one head in registers */
    rows_values((int)t->n, scores + h * s_stride, hq * s_stride, total + h * t->n,
                t->v_cache + h / group * d, t->table, last, t->bs, row, d, t->out + h * d,
                t->out_stride);
}

typedef struct {
  const float *k_cache, *v_cache; /* offset to the tile's kv head */
  const int32_t *table;
  int64_t bs, row, d;
  float scale;
} Keys;

/* One tile of n query rows over the same kv head: consecutive rows of one request (``causal``:
 * row i sees first + i keys) or heads of one row (each sees first keys). ``scores`` holds
 * TILE_ROWS rows of ``s_stride`` floats, a multiple of KEYS. */
ALWAYS_INLINE void tile_n(const int n, const Keys *kv, int causal, const float *q,
                          int64_t q_stride, int64_t first, float *scores, int64_t s_stride,
                          float *out, int64_t out_stride) {
  const int64_t last = causal ? first + n - 1 : first;
  tile_scores(n, q, q_stride, kv->k_cache, kv->table, last, kv->bs, kv->row, kv->d, kv->scale,
              scores, s_stride);
  float total[TILE_ROWS];
  for (int r = 0; r < n; ++r) {
    const int64_t len = causal ? first + r : first, padded = (len + KEYS - 1) / KEYS * KEYS;
    total[r] = softmax_numerators(scores + r * s_stride, len, padded);
    for (int64_t j = len; j < last; ++j) scores[r * s_stride + j] = 0.0f; /* future keys */
  }
  if (kv->d % VALUES_CH == 0)
    tile_values(n, VALUES_CH, scores, s_stride, total, kv->v_cache, kv->table, last, kv->bs, kv->row,
                kv->d, out, out_stride);
  else
    tile_values(n, 16, scores, s_stride, total, kv->v_cache, kv->table, last, kv->bs, kv->row,
                kv->d, out, out_stride);
}

static void tile(int n, const Keys *kv, int causal, const float *q, int64_t q_stride,
                 int64_t first, float *scores, int64_t s_stride, float *out, int64_t out_stride) {
  switch (n) {
    case 1: tile_n(1, kv, causal, q, q_stride, first, scores, s_stride, out, out_stride); break;
    case 2: tile_n(2, kv, causal, q, q_stride, first, scores, s_stride, out, out_stride); break;
    case 3: tile_n(3, kv, causal, q, q_stride, first, scores, s_stride, out, out_stride); break;
    default: tile_n(4, kv, causal, q, q_stride, first, scores, s_stride, out, out_stride); break;
  }
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Rows of a row tile (all heads at once), or 0 where a row has more than MAX_ROW_HEADS heads:
 * then tiles of up to TILE_ROWS rows (or decode-row heads) of one kv head. */
static int64_t tile_rows(int64_t hq) {
  if (hq > MAX_ROW_HEADS) return 0;
  return MAX_ROW_HEADS / hq < TILE_ROWS ? MAX_ROW_HEADS / hq : TILE_ROWS;
}

/* The number of tiles a request's ``rows`` are cut into, each of at most ``most`` rows: the
 * fewest, rounded up to a multiple of ``threads`` where there are rows enough, so that the
 * request spreads evenly over the threads (19 rows in tiles of 4 are 5 items, 3 of them on one
 * of 2 threads; in 6 tiles of 3-4 rows, 3 each). Tile i holds rows [rows * i / tiles,
 * rows * (i + 1) / tiles). */
static int64_t tiles_of(int64_t rows, int64_t most, int64_t threads) {
  const int64_t fewest = ceil_div(rows, most), even = ceil_div(fewest, threads) * threads;
  return even <= rows ? even : fewest;
}

/* A request's work items: a decode row in tiles of up to TILE_ROWS heads of one kv head (so a
 * lone decode row still spreads over the threads: one row tile of every head is one item; a
 * kv head's keys are read once, as decode reads them from memory); more rows in row tiles of
 * all heads spread evenly over the threads, or with too many heads, tiles of TILE_ROWS rows
 * per query head. */
static int64_t items_of(int64_t rows, int64_t hq, int64_t hkv, int64_t threads) {
  if (rows == 1) return hkv * ceil_div(hq / hkv, TILE_ROWS);
  const int64_t n = tile_rows(hq);
  return n ? tiles_of(rows, n, threads) : ceil_div(rows, TILE_ROWS) * hq;
}

static int64_t batch_items(const int32_t *starts, int64_t seqs, int64_t hq, int64_t hkv,
                           int64_t threads) {
  int64_t items = 0;
  for (int64_t r = 0; r < seqs; ++r) items += items_of(starts[r + 1] - starts[r], hq, hkv, threads);
  return items;
}

typedef struct {
  const float *q, *k_cache, *v_cache;
  const int32_t *tables, *starts, *ctx;
  int64_t q_row_stride, table_stride, hq, hkv, d, bs, threads;
  float scale, *out;
} Batch;

/* Item ``w`` of request ``r`` (``rows`` rows from ``start``), one of ``items`` (items_of). */
static void run_item(const Batch *b, int64_t r, int64_t w, int64_t items, float *scores,
                     int64_t s_stride) {
  const int64_t start = b->starts[r], rows = b->starts[r + 1] - start, d = b->d, hq = b->hq;
  const int64_t group = hq / b->hkv, width = hq * d;
  int64_t first_row = start, h, n, q_stride, out_stride;
  if (rows > 1 && tile_rows(hq)) { /* rows first_row .. first_row + n - 1, every head */
    first_row += rows * w / items;
    n = start + rows * (w + 1) / items - first_row;
    const RowTile t = {b->q + first_row * b->q_row_stride, b->k_cache, b->v_cache,
                       b->tables + r * b->table_stride, b->q_row_stride, n,
                       b->ctx[r] + (first_row - start) + 1, b->bs, hq, group, d, b->scale,
                       b->out + first_row * width, width};
    row_tile(&t, scores, s_stride);
    return;
  }
  if (rows == 1) { /* heads h .. h + n - 1 of one kv head */
    const int64_t chunks = ceil_div(group, TILE_ROWS);
    h = w / chunks * group + w % chunks * TILE_ROWS;
    n = group - w % chunks * TILE_ROWS, q_stride = d, out_stride = d;
  } else { /* rows first_row .. first_row + n - 1, head h */
    first_row += w / hq * TILE_ROWS, h = w % hq;
    n = start + rows - first_row, q_stride = b->q_row_stride, out_stride = width;
  }
  const int64_t at = (h / group) * d;
  const Keys kv = {b->k_cache + at, b->v_cache + at, b->tables + r * b->table_stride, b->bs,
                   b->hkv * d, d, b->scale};
  tile(n < TILE_ROWS ? (int)n : TILE_ROWS, &kv, rows > 1, b->q + first_row * b->q_row_stride + h * d,
       q_stride, b->ctx[r] + (first_row - start) + 1, scores, s_stride,
       b->out + first_row * width + h * d, out_stride);
}

/* Items [w0, w1) of ``b`` (request by request, items_of) with ``max_len`` keys at most. */
static int run_items(const Batch *b, int64_t max_len, int64_t w0, int64_t w1) {
  const int64_t s_stride = ceil_div(max_len, KEYS) * KEYS + KEYS;
  const int64_t rows = tile_rows(b->hq) ? MAX_ROW_HEADS : TILE_ROWS;
  float *scores = malloc(sizeof(float) * (size_t)(rows * s_stride));
  if (!scores) return -1;
  int64_t r = 0, item0 = 0; /* the request of item w, and its first item */
  for (int64_t w = w0; w < w1; ++w) {
    int64_t n;
    while (w >= item0 + (n = items_of(b->starts[r + 1] - b->starts[r], b->hq, b->hkv,
                                       b->threads)))
      item0 += n, ++r;
    run_item(b, r, w - item0, n, scores, s_stride);
  }
  free(scores);
  return 0;
}

typedef struct {
  Batch batch;
  int64_t max_len;
} Call;

static int call_items(const void *ctx, int64_t w0, int64_t w1) {
  const Call *c = ctx;
  return run_items(&c->batch, c->max_len, w0, w1);
}

/* qgemm.c's kvgate_parallel_for: the task over items [0, items) on up to ``threads`` threads. */
typedef int (*parallel_fn)(int (*task)(const void *, int64_t, int64_t), const void *ctx,
                           int64_t items, int threads);

/* The whole batch: q and out [T][hq][d], q rows ``q_row_stride`` floats apart; d a multiple of
 * 16 up to MAX_HEAD_DIM; ``seqs`` requests. ``parallel`` runs the work items on its
 * pool (NULL: here, on one thread). Returns 0, or -1 without memory. */
int kvgate_paged_attention(const float *q, int64_t q_row_stride, const float *k_cache,
                           const float *v_cache, const int32_t *tables, int64_t table_stride,
                           const int32_t *starts, const int32_t *ctx, int64_t hq, int64_t hkv,
                           int64_t d, int64_t bs, int64_t max_len, float scale, float *out,
                           int64_t seqs, parallel_fn parallel, int threads) {
  const Call c = {{q, k_cache, v_cache, tables, starts, ctx, q_row_stride, table_stride, hq, hkv,
                   d, bs, parallel ? threads : 1, scale, out},
                  max_len};
  const int64_t items = batch_items(starts, seqs, hq, hkv, c.batch.threads);
  return parallel ? parallel(call_items, &c, items, threads) : call_items(&c, 0, items);
}

int kvgate_attention_max_head_dim(void) { return MAX_HEAD_DIM; }
