/* y[m, n] = x[m, k] . W[n, k]^T (+ bias), W kept in GGUF's block formats: float32 x and y, one
 * thread per call; AVX-512 or AVX2 + FMA + F16C.
 *
 * Q4_1: a block of 32 weights of one output is d * q + m (q in 0..15; d, m float16), so
 *   y = sum over blocks of  d * (x . q) + m * sum(x).
 * Q8_0: a block is d * q (q int8), so  y = sum over blocks of  d * (x . q).
 * The weights are never expanded in memory: each panel of PANEL outputs streams once per group of
 * rows, 4 or 8 bits a weight, and is widened to float32 in registers. W is packed into panels
 * (weights.py's ``pack``):
 *   Q4_1  qs [panels][blocks][32][PANEL / 2] bytes: the low nibble of byte j is output j, the high
 *         nibble output j + PANEL / 2;  dm [panels][blocks][2][PANEL] float16: d, then m.
 *   Q8_0  qs [panels][blocks][32][PANEL] int8;  d [panels][blocks][PANEL] float16.
 * A vector lane is an output, and every sum runs in the same order whatever m, the thread count or
 * the ISA is: a row's result depends on neither its batch nor the build.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, sched_yield */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "panels.h"

#if defined(__AVX512F__)
#define GROUP 6 /* 4 accumulators a row: 24 of 32 registers */
#define WIDE_GROUP 6 /* rows a group over widened weights */
/* 16 bytes -> 16 lanes: unsigned (nibble pairs) or signed (int8) */
#define vbytes_u(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define vbytes_s(p) _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define vlow(w) _mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(15)))
#define vhigh(w) _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4))
#define GROUP_SWITCH SWITCH_6
#else
#define GROUP 3 /* 12 accumulators + 2 weight vectors + 1 broadcast of 16 registers */
/* over widened weights: 12 block accumulators + 2 weight vectors + 1 broadcast, the totals
 * (touched once a block) on the stack; 8-12% faster than 3 rows at 16-64 rows (Zen 1) */
#define WIDE_GROUP 6
/* 8 bytes -> 8 lanes */
#define vbytes_u(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define vbytes_s(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define vlow(w) _mm256_cvtepi32_ps(_mm256_and_si256(w, _mm256_set1_epi32(15)))
#define vhigh(w) _mm256_cvtepi32_ps(_mm256_srli_epi32(w, 4))
#define GROUP_SWITCH SWITCH_3
#endif

int kvgate_qgemm_panel(void) { return PANEL; }

static inline __attribute__((always_inline)) void q4_1_group(
    const int rows, const float *x, const float *xsum, const int64_t k, const uint8_t *qs,
    const uint16_t *dm, float *y, const int64_t n, const int64_t cols, const float *bias) {
  const int64_t blocks = k / QBLOCK;
  vec lo[GROUP], hi[GROUP];
  for (int r = 0; r < rows; ++r) lo[r] = hi[r] = vzero();
  for (int64_t b = 0; b < blocks; ++b) {
    vec blo[GROUP], bhi[GROUP];
    for (int r = 0; r < rows; ++r) blo[r] = bhi[r] = vzero();
    const uint8_t *q = qs + b * QBLOCK * (PANEL / 2);
    const float *xb = x + b * QBLOCK;
    for (int i = 0; i < QBLOCK; ++i) {
      const ivec w = vbytes_u(q + i * (PANEL / 2));
      const vec w_lo = vlow(w), w_hi = vhigh(w);
      for (int r = 0; r < rows; ++r) {
        const vec xv = vset1(xb[r * k + i]);
        blo[r] = vfma(xv, w_lo, blo[r]);
        bhi[r] = vfma(xv, w_hi, bhi[r]);
      }
    }
    const uint16_t *s = dm + b * 2 * PANEL;
    const vec d_lo = vhalf(s), d_hi = vhalf(s + VW);
    const vec m_lo = vhalf(s + PANEL), m_hi = vhalf(s + PANEL + VW);
    for (int r = 0; r < rows; ++r) {
      const vec xs = vset1(xsum[r * blocks + b]);
      lo[r] = vfma(m_lo, xs, vfma(d_lo, blo[r], lo[r]));
      hi[r] = vfma(m_hi, xs, vfma(d_hi, bhi[r], hi[r]));
    }
  }
  store_group(rows, lo, hi, y, n, cols, bias);
}

static inline __attribute__((always_inline)) void q8_0_group(
    const int rows, const float *x, const int64_t k, const int8_t *qs, const uint16_t *d,
    float *y, const int64_t n, const int64_t cols, const float *bias) {
  const int64_t blocks = k / QBLOCK;
  vec lo[GROUP], hi[GROUP];
  for (int r = 0; r < rows; ++r) lo[r] = hi[r] = vzero();
  for (int64_t b = 0; b < blocks; ++b) {
    vec blo[GROUP], bhi[GROUP];
    for (int r = 0; r < rows; ++r) blo[r] = bhi[r] = vzero();
    const int8_t *q = qs + b * QBLOCK * PANEL;
    const float *xb = x + b * QBLOCK;
    for (int i = 0; i < QBLOCK; ++i) {
      const vec w_lo = vint(vbytes_s(q + i * PANEL));
      const vec w_hi = vint(vbytes_s(q + i * PANEL + VW));
      for (int r = 0; r < rows; ++r) {
        const vec xv = vset1(xb[r * k + i]);
        blo[r] = vfma(xv, w_lo, blo[r]);
        bhi[r] = vfma(xv, w_hi, bhi[r]);
      }
    }
    const vec d_lo = vhalf(d + b * PANEL), d_hi = vhalf(d + b * PANEL + VW);
    for (int r = 0; r < rows; ++r) {
      lo[r] = vfma(d_lo, blo[r], lo[r]);
      hi[r] = vfma(d_hi, bhi[r], hi[r]);
    }
  }
  store_group(rows, lo, hi, y, n, cols, bias);
}

/* A panel's q values widened to float32 once, [k][PANEL], for row blocks of several groups
 * (each group then reads floats instead of widening the same bytes again). */
static void widen_q4_1(const uint8_t *q, int64_t k, float *w) {
  for (int64_t i = 0; i < k; ++i) {
    const ivec v = vbytes_u(q + i * (PANEL / 2));
    vstore(w + i * PANEL, vlow(v));
    vstore(w + i * PANEL + VW, vhigh(v));
  }
}

static void widen_q8_0(const int8_t *q, int64_t k, float *w) {
  for (int64_t i = 0; i < k; ++i) {
    vstore(w + i * PANEL, vint(vbytes_s(q + i * PANEL)));
    vstore(w + i * PANEL + VW, vint(vbytes_s(q + i * PANEL + VW)));
  }
}

/* The same sums as q4_1_group / q8_0_group (xsum NULL: Q8_0), over widened weights. */
static inline __attribute__((always_inline)) void widened_group(
    const int rows, const float *x, const float *xsum, const int64_t k, const float *w,
    const uint16_t *s, float *y, const int64_t n, const int64_t cols, const float *bias) {
  const int64_t blocks = k / QBLOCK, stride = xsum ? 2 * PANEL : PANEL;
  vec lo[WIDE_GROUP], hi[WIDE_GROUP];
  for (int r = 0; r < rows; ++r) lo[r] = hi[r] = vzero();
  for (int64_t b = 0; b < blocks; ++b) {
    vec blo[WIDE_GROUP], bhi[WIDE_GROUP];
    for (int r = 0; r < rows; ++r) blo[r] = bhi[r] = vzero();
    const float *wb = w + b * QBLOCK * PANEL;
    const float *xb = x + b * QBLOCK;
    for (int i = 0; i < QBLOCK; ++i) {
      const vec w_lo = vload(wb + i * PANEL), w_hi = vload(wb + i * PANEL + VW);
      for (int r = 0; r < rows; ++r) {
        const vec xv = vset1(xb[r * k + i]);
        blo[r] = vfma(xv, w_lo, blo[r]);
        bhi[r] = vfma(xv, w_hi, bhi[r]);
      }
    }
    const vec d_lo = vhalf(s + b * stride), d_hi = vhalf(s + b * stride + VW);
    if (xsum) {
      const vec m_lo = vhalf(s + b * stride + PANEL), m_hi = vhalf(s + b * stride + PANEL + VW);
      for (int r = 0; r < rows; ++r) {
        const vec xs = vset1(xsum[r * blocks + b]);
        lo[r] = vfma(m_lo, xs, vfma(d_lo, blo[r], lo[r]));
        hi[r] = vfma(m_hi, xs, vfma(d_hi, bhi[r], hi[r]));
      }
    } else {
      for (int r = 0; r < rows; ++r) {
        lo[r] = vfma(d_lo, blo[r], lo[r]);
        hi[r] = vfma(d_hi, bhi[r], hi[r]);
      }
    }
  }
  store_group(rows, lo, hi, y, n, cols, bias);
}

#define Q4_CALL(R) q4_1_group(R, xr, xs, k, (const uint8_t *)q, sc, yr, n, cols, b)
#define Q8_CALL(R) q8_0_group(R, xr, k, (const int8_t *)q, sc, yr, n, cols, b)
#define WIDE_CALL(R) widened_group(R, xr, xs, k, wide, sc, yr, n, cols, b)

/* Panels [p0, p1) of either format (``xsum`` NULL: Q8_0). */
static int block_gemm(const float *x, const float *xsum, int64_t m, int64_t k, const void *qs,
                      const uint16_t *scales, int64_t n, const float *bias, float *out,
                      int64_t p0, int64_t p1) {
  const int64_t blocks = k / QBLOCK;
  const int64_t q_panel = k * (xsum ? PANEL / 2 : PANEL);
  const int64_t s_panel = blocks * (xsum ? 2 * PANEL : PANEL);
  float *wide = m > GROUP ? malloc(sizeof(float) * (size_t)(k * PANEL)) : 0;
  if (m > GROUP && !wide) return -1;
  for (int64_t rb = 0; rb < m; rb += ROWBLOCK) {
    const int64_t rb_end = m - rb < ROWBLOCK ? m : rb + ROWBLOCK;
    /* more rows than a group: each panel widened once, then read by groups of WIDE_GROUP */
    const int widened = rb_end - rb > GROUP;
    const int64_t size = widened ? WIDE_GROUP : GROUP;
    const int64_t groups = (rb_end - rb + size - 1) / size;
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t *q = (const uint8_t *)qs + p * q_panel;
      const uint16_t *sc = scales + p * s_panel;
      const int64_t col0 = p * PANEL;
      const int64_t cols = n - col0 < PANEL ? n - col0 : PANEL;
      const float *b = bias ? bias + col0 : 0;
      if (widened) {
        if (xsum) widen_q4_1(q, k, wide);
        else widen_q8_0((const int8_t *)q, k, wide);
      }
      for (int64_t g = 0, r0 = rb; g < groups; ++g) {
        const int64_t rows = group_rows(rb_end - r0, groups - g);
        const float *xr = x + r0 * k, *xs = xsum ? xsum + r0 * blocks : 0;
        float *yr = out + r0 * n + col0;
        if (widened) SWITCH_6(rows, WIDE_CALL)
        else if (xsum) GROUP_SWITCH(rows, Q4_CALL)
        else GROUP_SWITCH(rows, Q8_CALL)
        r0 += rows;
      }
    }
  }
  free(wide);
  return 0;
}

/* xsum [m][k / 32]: each block's sum of x, in index order (Q4_1's offsets meet it). */
static void block_sums(const float *x, int64_t m, int64_t k, float *xsum) {
  const int64_t blocks = k / QBLOCK;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      float s = 0.0f;
      for (int i = 0; i < QBLOCK; ++i) s += x[r * k + b * QBLOCK + i];
      xsum[r * blocks + b] = s;
    }
}

/* ---- A pool of threads that split one call's panels, for decode's many small GEMMs ----
 * Handing a GEMM of a few hundred microseconds to Python threads costs tens of microseconds per
 * call; these workers spin briefly on the call's ticket, then sleep on a condition variable, so
 * back-to-back calls start in about a microsecond. The caller and the workers claim a call's
 * items (panels, attention tiles) a chunk at a time from the ticket, each chunk a share of what
 * is left (guided self-scheduling: 60 items on 2 threads go 15, 11, 8, 6, 5, 3, 3, 3, 3, 3),
 * so a worker the OS has not scheduled delays nothing (the caller takes its items) and the
 * threads end a call within about one item of each other. One call uses the pool at a time; a
 * call that finds it busy (another engine thread of the process) runs on its own thread. The
 * pool lives until the process ends. */

#define MAX_WORKERS 63
/* Spin this long for the next call before sleeping: the gaps between a decode layer's GEMMs are
 * tens of microseconds; a longer spin would take the core from torch's own threads (the sampler
 * after the LM head) on a small machine. */
#define SPIN_NS 100000
/* a claim takes what is left / (threads * CHUNKS_PER_THREAD), and at least 1 / LEAST_PER_THREAD
 * of a thread's share */
#define CHUNKS_PER_THREAD 2
#define LEAST_PER_THREAD 8
#define ITEM_BITS 20
#define CALL_BITS (64 - 2 * ITEM_BITS) /* the call number, which wraps */
#define MAX_ITEMS ((INT64_C(1) << ITEM_BITS) - 1) /* a call of more runs on its own thread */

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Whether to go on spinning: true for SPIN_NS after the first call (*since == 0). */
static int keep_spinning(int64_t *since, int *rounds) {
  _mm_pause();
  if (++*rounds & 255) return 1;
  const int64_t t = now_ns();
  if (!*since) *since = t;
  return t - *since < SPIN_NS;
}

/* A parallel task: items [p0, p1) of the call whose arguments ``ctx`` points at; 0 or -1. */
typedef int (*task_fn)(const void *ctx, int64_t p0, int64_t p1);

static pthread_mutex_t pool_in_use = PTHREAD_MUTEX_INITIALIZER;

static struct {
  pthread_mutex_t lock;
  pthread_cond_t wake;
  /* (call number << 40) | (items << 20) | next unclaimed item: items are claimed by moving
   * next on, for the current call only. The call's item count is in the same word, so a claim
   * is checked against the items of the call it claims: a thread still looking at the last call
   * while the next one is being set up (fn and ctx written, ticket not yet moved) cannot claim
   * items past the last call's end, which would run the next call's task with its counters
   * reset and let that call return before those items end. (The call number wraps at
   * 2^CALL_BITS: a claim that succeeds is of the current call whatever number its thread saw.) */
  atomic_uint_fast64_t ticket;
  atomic_int_fast64_t completed; /* items of the current call done */
  atomic_int failed;
  atomic_int threads; /* of the current call: sets the chunk size (any value is correct) */
  int workers, sleeping;
  task_fn fn;
  const void *ctx;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

#define TICKET_CALL(t) ((t) >> (2 * ITEM_BITS))
#define TICKET_ITEMS(t) ((int64_t)(((t) >> ITEM_BITS) & MAX_ITEMS))
#define TICKET_NEXT(t) ((int64_t)((t) & MAX_ITEMS))

/* Claim and run chunks of call ``call`` until none is left. */
static void run_parts(uint64_t call) {
  uint64_t t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
  while (TICKET_CALL(t) == call && TICKET_NEXT(t) < TICKET_ITEMS(t)) {
    const int64_t p0 = TICKET_NEXT(t), items = TICKET_ITEMS(t), left = items - p0;
    const int64_t threads = atomic_load_explicit(&pool.threads, memory_order_relaxed);
    const int64_t guided = left / (CHUNKS_PER_THREAD * threads);
    const int64_t least = items / (threads * LEAST_PER_THREAD);
    const int64_t want = guided > least ? guided : least > 0 ? least : 1;
    const int64_t take = want < left ? want : left;
    if (!atomic_compare_exchange_weak_explicit(&pool.ticket, &t, t + (uint64_t)take,
                                               memory_order_acq_rel, memory_order_acquire))
      continue;
    /* claimed: the call cannot end before these items do, so its fields stay as they are */
    if (pool.fn(pool.ctx, p0, p0 + take) != 0) atomic_store(&pool.failed, 1);
    atomic_fetch_add_explicit(&pool.completed, take, memory_order_release);
    t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
  }
}

static void *worker(void *arg) {
  (void)arg;
  uint64_t seen = 0;
  for (;;) {
    int rounds = 0;
    int64_t since = 0;
    while (TICKET_CALL(atomic_load_explicit(&pool.ticket, memory_order_acquire)) == seen) {
      if (keep_spinning(&since, &rounds)) continue;
      pthread_mutex_lock(&pool.lock);
      pool.sleeping++;
      while (TICKET_CALL(atomic_load(&pool.ticket)) == seen)
        pthread_cond_wait(&pool.wake, &pool.lock);
      pool.sleeping--;
      pthread_mutex_unlock(&pool.lock);
    }
    seen = TICKET_CALL(atomic_load_explicit(&pool.ticket, memory_order_acquire));
    run_parts(seen);
  }
  return 0;
}

static int grow_pool(int workers) {
  while (pool.workers < workers && pool.workers < MAX_WORKERS) {
    pthread_t t;
    if (pthread_create(&t, 0, worker, 0) != 0) break;
    pthread_detach(t);
    pool.workers++;
  }
  return pool.workers;
}

/* ``fn`` over items [0, items) on up to ``threads`` threads (this one included), in chunks of
 * whole items; one thread while another call holds the pool. Returns 0, or -1 on failure. Other
 * kernels (attention.c) run on this pool through this function's address. */
int kvgate_parallel_for(task_fn fn, const void *ctx, int64_t items, int threads) {
  if (threads < 2 || items < 2 || items > MAX_ITEMS || pthread_mutex_trylock(&pool_in_use) != 0)
    return fn(ctx, 0, items);
  const int workers = grow_pool(threads - 1);
  if (workers == 0) {
    pthread_mutex_unlock(&pool_in_use);
    return fn(ctx, 0, items);
  }
  pool.fn = fn, pool.ctx = ctx;
  atomic_store(&pool.threads, workers + 1);
  atomic_store(&pool.failed, 0);
  atomic_store(&pool.completed, 0);
  const uint64_t wrap = (UINT64_C(1) << CALL_BITS) - 1;
  const uint64_t call = (TICKET_CALL(atomic_load(&pool.ticket)) + 1) & wrap;
  pthread_mutex_lock(&pool.lock);
  atomic_store_explicit(&pool.ticket, call << (2 * ITEM_BITS) | (uint64_t)items << ITEM_BITS,
                        memory_order_release);
  if (pool.sleeping) pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.lock);
  run_parts(call);
  int rounds = 0;
  int64_t since = 0;
  while (atomic_load_explicit(&pool.completed, memory_order_acquire) < items)
    if (!keep_spinning(&since, &rounds)) sched_yield(); /* a worker holding items is not running */
  const int failed = atomic_load(&pool.failed);
  pthread_mutex_unlock(&pool_in_use);
  return failed ? -1 : 0;
}

typedef struct {
  const float *x, *xsum, *bias; /* xsum: Q4_1's block sums of x, NULL for Q8_0 */
  float *out;
  const void *qs;
  const uint16_t *scales;
  int64_t m, k, n;
} GemmCall;

static int panels_task(const void *ctx, int64_t p0, int64_t p1) {
  const GemmCall *c = ctx;
  return block_gemm(c->x, c->xsum, c->m, c->k, c->qs, c->scales, c->n, c->bias, c->out, p0, p1);
}

/* Q4_1's x block sums are taken once a call, before its panels are split over the threads. */
int kvgate_q4_1_gemm_threads(const float *x, int64_t m, int64_t k, const uint8_t *qs,
                             const uint16_t *dm, int64_t n, const float *bias, float *out,
                             int64_t panels, int threads) {
  float *xsum = malloc(sizeof(float) * (size_t)(m * (k / QBLOCK)));
  if (!xsum) return -1;
  block_sums(x, m, k, xsum);
  const GemmCall c = {x, xsum, bias, out, qs, dm, m, k, n};
  const int status = kvgate_parallel_for(panels_task, &c, panels, threads);
  free(xsum);
  return status;
}

int kvgate_q8_0_gemm_threads(const float *x, int64_t m, int64_t k, const int8_t *qs,
                             const uint16_t *d, int64_t n, const float *bias, float *out,
                             int64_t panels, int threads) {
  const GemmCall c = {x, 0, bias, out, qs, d, m, k, n};
  return kvgate_parallel_for(panels_task, &c, panels, threads);
}
