// A tracer for llama.cpp programs (LD_PRELOAD), to compare how two programs drive llama.cpp:
// per context, the llama_decode / llama_process calls by batch size (1 .. 19 tokens, 20 = 20 or
// more) with the thread CPU time of each (mean, median, fastest); llama_memory_seq_rm / seq_cp /
// seq_keep calls per memory; llama_get_logits_ith calls. Printed to stderr at exit; with
// TRACE_LOG=FILE also every call as "<context> <tokens> <microseconds>", in order.
//
//   P=$(scripts/llama_cpp.sh --prefix)
//   gcc -O2 -shared -fPIC -I"$P/include" tools/llama_trace.c -o build/llama_trace.so -ldl
//   LD_PRELOAD=build/llama_trace.so build/examples/llama_cpp/specula_llama_sd_bench ...
//   LD_PRELOAD=build/llama_trace.so llama-speculative ...
//
// docs/RESULTS.md (llama.cpp section) reads llama-speculative and specula's SD loop with it.
// Contexts and memories are numbered in the order of their first call.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <llama.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MAXC 8
#define MAXB 20
#define MAXS 4096
typedef struct {
  const void* ctx;
  long n[MAXB + 1];
  double t[MAXB + 1];
  float s[MAXB + 1][MAXS];
} ctx_stat;
static ctx_stat cs[MAXC];
static int ncs;
typedef struct {
  const void* mem;
  long rm, cp, keep;
} mem_stat;
static mem_stat ms[MAXC];
static int nms;
typedef struct {
  const void* b;
  int n;
} bat;
static bat bs[MAXC];
static int nbs;
static long logits_calls;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
static ctx_stat* cfind(const void* c) {
  for (int i = 0; i < ncs; ++i)
    if (cs[i].ctx == c) return &cs[i];
  if (ncs == MAXC) return &cs[MAXC - 1];
  cs[ncs].ctx = c;
  return &cs[ncs++];
}
static mem_stat* mfind(const void* m) {
  for (int i = 0; i < nms; ++i)
    if (ms[i].mem == m) return &ms[i];
  if (nms == MAXC) return &ms[MAXC - 1];
  ms[nms].mem = m;
  return &ms[nms++];
}
static bat* bfind(const void* b) {
  for (int i = 0; i < nbs; ++i)
    if (bs[i].b == b) return &bs[i];
  if (nbs == MAXC) return &bs[MAXC - 1];
  bs[nbs].b = b;
  return &bs[nbs++];
}
static FILE* logf;
static void record(const void* ctx, int n, double t) {
  ctx_stat* s = cfind(ctx);
  if (!logf && getenv("TRACE_LOG")) logf = fopen(getenv("TRACE_LOG"), "w");
  if (logf) fprintf(logf, "%d %d %.1f\n", (int)(s - cs), n, 1e6 * t);
  if (n > MAXB) n = MAXB;
  if (s->n[n] < MAXS) s->s[n][s->n[n]] = (float)t;
  s->n[n]++;
  s->t[n] += t;
}

static int cmpf(const void* a, const void* b) {
  const float x = *(const float*)a, y = *(const float*)b;
  return (x > y) - (x < y);
}
#define REAL(name)               \
  static __typeof__(&name) real; \
  if (!real) real = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

int32_t llama_decode(struct llama_context* ctx, struct llama_batch batch) {
  REAL(llama_decode);
  const double t0 = now();
  const int32_t rc = real(ctx, batch);
  record(ctx, batch.n_tokens, now() - t0);
  return rc;
}
int32_t llama_process(struct llama_context* ctx, enum llama_process_type type,
                      struct llama_batch_ext* batch) {
  REAL(llama_process);
  const double t0 = now();
  const int32_t rc = real(ctx, type, batch);
  record(ctx, bfind(batch)->n, now() - t0);
  return rc;
}
void llama_batch_ext_clear(struct llama_batch_ext* batch) {
  REAL(llama_batch_ext_clear);
  bfind(batch)->n = 0;
  real(batch);
}
int32_t llama_batch_ext_add_token(struct llama_batch_ext* batch, llama_seq_id s, llama_token id) {
  REAL(llama_batch_ext_add_token);
  const int32_t r = real(batch, s, id);
  if (r >= 0) bfind(batch)->n++;
  return r;
}
bool llama_memory_seq_rm(llama_memory_t mem, llama_seq_id s, llama_pos p0, llama_pos p1) {
  REAL(llama_memory_seq_rm);
  mfind(mem)->rm++;
  return real(mem, s, p0, p1);
}
void llama_memory_seq_cp(llama_memory_t mem, llama_seq_id a, llama_seq_id b, llama_pos p0,
                         llama_pos p1) {
  REAL(llama_memory_seq_cp);
  mfind(mem)->cp++;
  real(mem, a, b, p0, p1);
}
void llama_memory_seq_keep(llama_memory_t mem, llama_seq_id s) {
  REAL(llama_memory_seq_keep);
  mfind(mem)->keep++;
  real(mem, s);
}
float* llama_get_logits_ith(struct llama_context* ctx, int32_t i) {
  REAL(llama_get_logits_ith);
  ++logits_calls;
  return real(ctx, i);
}

__attribute__((destructor)) static void report(void) {
  for (int i = 0; i < ncs; ++i) {
    long calls = 0;
    double t = 0;
    for (int b = 0; b <= MAXB; ++b) calls += cs[i].n[b], t += cs[i].t[b];
    fprintf(stderr, "[trace] ctx %d: %ld decodes, %.3f ms CPU (%.1f us each);", i, calls, 1e3 * t,
            calls ? 1e6 * t / calls : 0.0);
    for (int b = 0; b <= MAXB; ++b)
      if (cs[i].n[b]) {
        const long m = cs[i].n[b] < MAXS ? cs[i].n[b] : MAXS;
        qsort(cs[i].s[b], m, sizeof(float), cmpf);
        fprintf(stderr, " n=%d: %ld x mean %.1f median %.1f min %.1f us", b, cs[i].n[b],
                1e6 * cs[i].t[b] / cs[i].n[b], 1e6 * cs[i].s[b][m / 2], 1e6 * cs[i].s[b][0]);
      }
    fprintf(stderr, "\n");
  }
  for (int i = 0; i < nms; ++i)
    fprintf(stderr, "[trace] mem %d: seq_rm %ld, seq_cp %ld, seq_keep %ld\n", i, ms[i].rm, ms[i].cp,
            ms[i].keep);
  fprintf(stderr, "[trace] llama_get_logits_ith: %ld\n", logits_calls);
}
