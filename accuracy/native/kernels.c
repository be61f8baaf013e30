/* One pass over a contiguous fp32/fp64 block: min, max, sum, sum of squares, the count of
 * non-finite values and the wrapping sum of the raw bit patterns (the dump's checksum).
 *
 * Built on first use by accuracy/native/__init__.py and called through ctypes, which releases
 * the GIL for the call. No -ffast-math: `omp simd` reductions let the compiler vectorise
 * min/max/sum without it, and NaN/inf must stay what IEEE says. Sums accumulate in fp64, as
 * numpy's path for small tensors did: fp32 squares of 1e-25 underflow to 0 and of 1e20
 * overflow, and an fp32 sum loses 1 beside 1e8 (fp64 lanes cost a third more than fp32 ones).
 *
 * out: [min, max, sum, sum of squares]; counts: [1 if an element is not finite, checksum].
 * inf reaches min or max and NaN the sum, so that is all that is checked (a test per element
 * cost a fifth of the pass). With a non-finite element present the caller recomputes the
 * figures, counting NaN and inf apart.
 */
#include <math.h>
#include <stdint.h>

void stats_f32(const float *x, int64_t n, double *out, int64_t *counts) {
    const uint32_t *u = (const uint32_t *)x;
    float mn = INFINITY, mx = -INFINITY;
    double sum = 0.0, sumsq = 0.0;
    uint32_t bits = 0;
#pragma omp simd reduction(min : mn) reduction(max : mx) reduction(+ : sum, sumsq, bits)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        double w = v;
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
        sum += w;
        sumsq += w * w;
        bits += u[i];
    }
    out[0] = mn;
    out[1] = mx;
    out[2] = sum;
    out[3] = sumsq;
    counts[0] = !(isfinite(mn) && isfinite(mx)) || isnan(sum);
    counts[1] = (int64_t)(int32_t)bits; /* stored signed, as the other paths store it */
}

void stats_f64(const double *x, int64_t n, double *out, int64_t *counts) {
    const uint64_t *u = (const uint64_t *)x;
    double mn = INFINITY, mx = -INFINITY, sum = 0.0, sumsq = 0.0;
    uint64_t bits = 0;
#pragma omp simd reduction(min : mn) reduction(max : mx) reduction(+ : sum, sumsq, bits)
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
        sum += v;
        sumsq += v * v;
        bits += u[i];
    }
    out[0] = mn;
    out[1] = mx;
    out[2] = sum;
    out[3] = sumsq;
    counts[0] = !(isfinite(mn) && isfinite(mx)) || isnan(sum);
    counts[1] = (int64_t)bits;
}

/* stats_f32/stats_f64 of k blocks in one call (the monitor's figures of a step's many small
 * tensors, where a ctypes call per tensor cost more than its pass): block i is ns[i] values at
 * ptrs[i], fp32 where fp32[i] else fp64; its [min, max, sum, sum of squares] go to out[4i..]
 * and its non-finite flag to flags[i] (the checksums are not kept).
 */
void stats_many(void *const *ptrs, const int64_t *ns, const int8_t *fp32, int64_t k,
                double *out, int64_t *flags) {
    int64_t counts[2];
    for (int64_t i = 0; i < k; i++) {
        if (fp32[i])
            stats_f32((const float *)ptrs[i], ns[i], out + 4 * i, counts);
        else
            stats_f64((const double *)ptrs[i], ns[i], out + 4 * i, counts);
        flags[i] = counts[0];
    }
}

/* One chunk of a compare (accuracy/compare/metrics.py, StreamingMetrics.update) in one pass
 * over fp64 values x (mine) and y (golden): sums = [x.x, y.y, x.y, d.d, sum |d|, max |d|,
 * sum rel, max rel], counts = [1 if the chunk holds a non-finite value, rel < 1e-3,
 * rel < 5e-3], where d = x - y and rel = |d| / max(|y|, rel_eps). A non-finite value makes a
 * sum of squares non-finite, so that is all that is checked (no test per element: it made the
 * loop 5x slower); a sum of squares that overflows says the same. Then the sums are not
 * meaningful: the caller compares that chunk the slower way, which sets such pairs apart.
 */
#define DEFINE_COMPARE(NAME, MINE)                                                          \
    void NAME(const MINE *x, const double *y, int64_t n, double rel_eps, double *sums,      \
              int64_t *counts) {                                                            \
        double sxx = 0.0, syy = 0.0, sxy = 0.0, sdd = 0.0, sad = 0.0, srel = 0.0;           \
        double max_ad = 0.0, max_rel = 0.0;                                                 \
        int64_t c1 = 0, c5 = 0;                                                             \
        _Pragma("omp simd reduction(+:sxx,syy,sxy,sdd,sad,srel,c1,c5) reduction(max:max_ad,max_rel)") \
        for (int64_t i = 0; i < n; i++) {                                                   \
            double a = x[i], b = y[i];                                                      \
            double d = a - b;                                                               \
            double ad = fabs(d), ay = fabs(b);                                              \
            double rel = ad / (ay < rel_eps ? rel_eps : ay);                                \
            sxx += a * a;                                                                   \
            syy += b * b;                                                                   \
            sxy += a * b;                                                                   \
            sdd += d * d;                                                                   \
            sad += ad;                                                                      \
            srel += rel;                                                                    \
            max_ad = ad > max_ad ? ad : max_ad;                                             \
            max_rel = rel > max_rel ? rel : max_rel;                                        \
            c1 += rel < 0.001;                                                              \
            c5 += rel < 0.005;                                                              \
        }                                                                                   \
        double out[8] = {sxx, syy, sxy, sdd, sad, max_ad, srel, max_rel};                  \
        for (int k = 0; k < 8; k++)                                                         \
            sums[k] = out[k];                                                               \
        counts[0] = !(isfinite(sxx) && isfinite(syy));                                      \
        counts[1] = c1;                                                                     \
        counts[2] = c5;                                                                     \
    }

DEFINE_COMPARE(compare_f64, double)
/* mine in fp32 (a replayed fp32 output against its fp64 reference): no fp64 copy of it
 * first, which cost more than the pass */
DEFINE_COMPARE(compare_f32_f64, float)
