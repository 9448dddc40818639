/* Probe of qgemm.c's thread pool (kvgate_parallel_for): calls back to back, with part counts
 * that change from call to call, each of a task that counts how often each item ran. A correct
 * pool runs every item of a call exactly once, and returns only after the call's last item. */
#include <stdatomic.h>
#include <stdint.h>

typedef int (*task_fn)(const void *ctx, int64_t p0, int64_t p1);
typedef int (*parallel_fn)(task_fn fn, const void *ctx, int64_t items, int threads);

#define MAX_ITEMS 64

typedef struct {
  atomic_int runs[MAX_ITEMS];
  atomic_int live; /* parts running now */
} Call;

static int count_items(const void *ctx, int64_t p0, int64_t p1) {
  Call *c = (Call *)ctx;
  atomic_fetch_add(&c->live, 1);
  for (int64_t i = p0; i < p1; ++i) atomic_fetch_add(&c->runs[i], 1);
  atomic_fetch_sub(&c->live, 1);
  return 0;
}

/* Violations over ``rounds`` calls: an item not run exactly once, or a part still running when
 * the call returned. Two call records alternate, so a late part of one call lands in its own. */
int64_t kvgate_pool_probe(parallel_fn parallel, int64_t rounds, int threads) {
  static Call calls[2];
  static const int64_t items[] = {2, 40, 3, 64, 5, 17};
  int64_t bad = 0;
  for (int64_t r = 0; r < rounds; ++r) {
    Call *c = &calls[r & 1];
    const int64_t n = items[r % 6];
    for (int i = 0; i < MAX_ITEMS; ++i) atomic_store(&c->runs[i], 0);
    parallel(count_items, c, n, threads);
    if (atomic_load(&c->live) != 0) ++bad;
    for (int64_t i = 0; i < n; ++i)
      if (atomic_load(&c->runs[i]) != 1) ++bad;
  }
  return bad;
}
