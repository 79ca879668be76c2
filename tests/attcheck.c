/*
 * tests/attcheck.c - see attcheck.h.  The reference is attention.c's
 * attend_one written over keys and values in rows: a score is q[d] * k[d]
 * summed in d order, fused, from zero; a value sum runs in key order.
 */
#include "attcheck.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void attend_ref(const float *q, const float *k, const float *v, int lo, int pos, int hd,
                       float scale, float cap, float *scores, float *out)
{
    float mx = -INFINITY;
    for (int j = lo; j <= pos; j++) {
        float s = 0.0f;
        for (int d = 0; d < hd; d++)
            s = fmaf(q[d], k[(size_t)j * hd + d], s);
        s *= scale;
        if (cap > 0)
            s = lm_softcap(s, cap);
        scores[j] = s;
        mx = s > mx ? s : mx;
    }
    float inv = lm_softmax_exp(scores, lo, pos, mx);
    for (int i = 0; i < hd; i++)
        out[i] = 0.0f;
    for (int j = lo; j <= pos; j++)
        for (int i = 0; i < hd; i++)
            out[i] = fmaf(scores[j], v[(size_t)j * hd + i], out[i]);
    for (int i = 0; i < hd; i++)
        out[i] *= inv;
}

/* Keys in rows (n of hd) laid out as lm_kv's tiles of 16 positions, f32 and f16. */
static void keys_to_tiles(const float *k, int n, int hd, float *t, uint16_t *t16)
{
    for (int j = 0; j < n; j++)
        for (int d = 0; d < hd; d++) {
            size_t at = (size_t)(j / 16) * 16 * hd + (size_t)d * 16 + j % 16;
            t[at] = k[(size_t)j * hd + d];
            t16[at] = lm_f32_to_f16(t[at]);
        }
}

/* Queries qs[0..n) against the reference; counts those that differ. */
static int compare_group(attend_fn attend, const lm_attq *qs, int n, const float *k, const float *v,
                         const void *kt, const void *vt, int hd, float scale, float cap, int f16,
                         float *scores, size_t sstride, char *msg, size_t msg_cap)
{
    static float acc[LM_ATT_QMAX * LM_ATT_ACC], s1[1024], o1[256];
    if (!attend(qs, n, kt, vt, hd, hd, scale, cap, scores, sstride, acc, f16)) {
        snprintf(msg, msg_cap, "hd %d: the fast path declined", hd);
        return n;
    }
    int bad = 0;
    for (int a = 0; a < n; a++) {
        attend_ref(qs[a].q, k, v, qs[a].lo, qs[a].pos, hd, scale, cap, s1, o1);
        if (memcmp(o1, qs[a].out, (size_t)hd * sizeof *o1) && !bad++)
            snprintf(msg, msg_cap, "hd %d f16 %d cap %g query %d of %d (lo %d pos %d)", hd, f16, cap, a, n,
                     qs[a].lo, qs[a].pos);
    }
    return bad;
}

int attcheck_groups(attend_fn attend, char *msg, size_t cap)
{
    enum { N = 150, NPOS = 160, HD = 256, NQ = LM_ATT_QMAX };
    static const int dims[] = {64, 96, 128, 256}; /* the unrolled sizes, and one that is not */
    static const int counts[] = {1, 2, 7, 6, NQ}; /* queries in a group (AVX2 sets: 7 is 4 + 3) */
    static float k[N * HD], v[N * HD], q[NQ * HD], s2[NQ * N], o2[NQ * HD], kt[NPOS * HD];
    static uint16_t kt16[NPOS * HD], v16[N * HD];
    for (int i = 0; i < N * HD; i++) {
        k[i] = lm_f16_to_f32(lm_f32_to_f16(sinf((float)i * 0.37f) * 3.0f));
        v16[i] = lm_f32_to_f16(cosf((float)i * 0.21f)), v[i] = lm_f16_to_f32(v16[i]);
    }
    for (int i = 0; i < NQ * HD; i++)
        q[i] = sinf((float)i * 1.3f);
    int bad = 0;
    for (int c = 0; c < 4 * 2 * 5 * 3; c++) {
        int hd = dims[c % 4], f16 = c / 4 % 2, n = counts[c / 8 % 5], start = 53 * (c / 40 % 3);
        float soft = start % 2 ? 0.0f : 2.0f;
        lm_attq qs[NQ];
        for (int a = 0; a < n; a++) { /* pairs share lo; some windows cut */
            int pos = (start + 13 * a) % N, lo = (a / 2) % 3 == 2 ? pos / 3 : 0;
            qs[a] = (lm_attq){q + a * HD, o2 + a * HD, lo, pos};
        }
        keys_to_tiles(k, N, hd, kt, kt16);
        bad += compare_group(attend, qs, n, k, v, f16 ? (void *)kt16 : kt, f16 ? (void *)v16 : v, hd,
                             1.0f / sqrtf((float)hd), soft, f16, s2, N, bad ? NULL : msg, bad ? 0 : cap);
    }
    return bad;
}

int attcheck_range_edges(attend_fn attend, int n_step, char *msg, size_t cap)
{
    enum { N = 200, NPOS = 208, HD = 128, NQ = LM_ATT_QMAX };
    static float k[N * HD], v[N * HD], q[NQ * HD], kt[NPOS * HD], s1[256], s2[NQ * 256];
    static float want[NQ * HD], got[NQ * HD], acc[NQ * LM_ATT_ACC];
    static uint16_t kt16[NPOS * HD], v16[N * HD];
    int bad = 0;
    for (int i = 0; i < NQ * HD; i++)
        q[i] = 0.5f + 0.01f * (float)(i % 5);
    for (int c = 0; c < 2 * 2 * 2; c++) {
        const int rising = c % 2, hd = c / 2 % 2 ? 128 : 64, f16 = c / 4;
        for (int j = 0; j < N; j++)
            for (int d = 0; d < hd; d++) {
                float x = 0.01f * (float)(rising ? j : N - j) + 0.001f * (float)(d % 7);
                k[j * hd + d] = lm_f16_to_f32(lm_f32_to_f16(x));
                v16[j * hd + d] = lm_f32_to_f16(cosf((float)(j * hd + d) * 0.21f));
                v[j * hd + d] = lm_f16_to_f32(v16[j * hd + d]);
            }
        keys_to_tiles(k, N, hd, kt, kt16);
        for (int shift = 0; shift < 16; shift++) { /* every place in a tile for the ends */
            lm_attq qs[NQ];
            for (int a = 0; a < NQ; a++) { /* ends 1..15 apart, windows starting mid-tile */
                int pos = 100 + shift + 7 * a % 61, lo = rising ? 0 : 3 + shift + 5 * a % 37;
                qs[a] = (lm_attq){q + a * HD, got + a * HD, lo, pos};
                attend_ref(qs[a].q, k, v, lo, pos, hd, 0.125f, 0.0f, s1, want + a * HD);
            }
            for (int n = 1; n <= NQ; n += n_step) { /* query a's output does not depend on n */
                if (!attend(qs, n, f16 ? (void *)kt16 : kt, f16 ? (void *)v16 : v, hd, hd, 0.125f, 0.0f, s2, 256,
                            acc, f16))
                    return snprintf(msg, cap, "hd %d: the fast path declined", hd), n;
                for (int a = 0; a < n; a++)
                    if (memcmp(want + a * HD, got + a * HD, (size_t)hd * sizeof *got) && !bad++)
                        snprintf(msg, cap, "rising %d hd %d f16 %d shift %d query %d of %d (lo %d pos %d)", rising,
                                 hd, f16, shift, a, n, qs[a].lo, qs[a].pos);
            }
        }
    }
    return bad;
}

int attcheck_f16_rows(f16_rows_fn convert, size_t step, char *msg, size_t cap)
{
    enum { N = 65536 + 15 };
    static uint16_t src[N];
    static float dst[N];
    int bad = 0;
    for (size_t i = 0; i < N; i++)
        src[i] = (uint16_t)(i * 40503u); /* every value, in an order that puts far ones side by side */
    for (size_t n = N - 15; n <= N; n++) {
        memset(dst, 0, sizeof dst);
        const size_t done = convert(dst, src, n);
        if (done != n / step * step) {
            snprintf(msg, cap, "%zu values: converted %zu", n, done);
            return bad + 1;
        }
        for (size_t i = 0; i < N; i++) {
            const float want = i < done ? lm_f16_to_f32(src[i]) : 0.0f;
            if (memcmp(&dst[i], &want, sizeof want) && !(isnan(dst[i]) && isnan(want)) && !bad++)
                snprintf(msg, cap, "%zu values: f16 0x%04x -> %a, not %a", n, (unsigned)src[i], dst[i], want);
        }
    }
    return bad;
}
