/*
 * tests/test_bounds.c - the kernels read nothing past a matrix's last row.
 * Weights are mapped straight from the file, and a tensor may end where the
 * mapping ends: a kernel that loads a whole step of blocks where a row has
 * fewer left would fault there (or, elsewhere, read another tensor's bytes
 * and count on zeros to cancel them).  Here every matrix ends right at a
 * page that cannot be read, and goes through lm_matmul on every path this
 * CPU has (AVX-512 with and without VBMI, AVX2, scalar), for one token, a
 * few, and a batch, at widths whose last step is short.
 */
#include "util.h"
#include "qrows.h"

#include <sys/mman.h>
#include <unistd.h>

enum { ROWS = 19, NT = 40 };

/* A readable region of at least n bytes that ends where an unreadable page begins. */
static uint8_t *before_guard(size_t n, void **map, size_t *map_len)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t body = (n + page - 1) / page * page;
    *map_len = body + page;
    uint8_t *p = mmap(NULL, *map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert(p != MAP_FAILED);
    ck_assert(mprotect(p + body, page, PROT_NONE) == 0);
    *map = p;
    return p + body - n;
}

/* w's type through every path of this CPU; the scratch restored after. */
static void every_path(lm_tensor *w, const float *x, float *out, mm_scratch *s)
{
    static const int counts[] = {1, 3, 17, NT};
    const int isa = s->isa, amx = s->amx, vbmi = s->vbmi, gfni = s->gfni;
    for (int path = 0; path < 4; path++) {
        if (path == 1) /* AVX-512 without AMX, VBMI and GFNI */
            s->amx = s->vbmi = s->gfni = 0;
        if (path == 2) /* AVX2 */
            s->isa = isa >= LM_ISA_AVX2 ? LM_ISA_AVX2 : isa;
        if (path == 3)
            s->isa = LM_ISA_SCALAR;
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            lm_matmul(out, w, x, counts[c], s);
    }
    s->isa = isa, s->amx = amx, s->vbmi = vbmi, s->gfni = gfni;
}

START_TEST(test_matmul_reads_only_its_rows)
{
    static const int b32_blocks[] = {1, 12, 17, 18, 20, 23, 25, 28, 31, 33};
    static const int k_blocks[] = {1, 3, 5};
    static float x[NT * KMAX], out[NT * ROWS];
    uint64_t seed = 41;
    for (int i = 0; i < NT * KMAX; i++)
        x[i] = cosf((float)i * 0.017f) * (float)(1 + i % 3);
    mm_scratch s = {0};
    ck_assert(mm_scratch_init(&s, 2, KMAX, NT) == 0);
    for (int ti = 0; ti < N_ALL_TYPES; ti++) {
        const uint32_t ty = ALL_TYPES[ti];
        const int kq = lm_type_block(ty) == 256;
        const int nw = kq ? (int)(sizeof k_blocks / sizeof *k_blocks) : (int)(sizeof b32_blocks / sizeof *b32_blocks);
        for (int wi = 0; wi < nw; wi++) {
            const int k = kq ? 256 * k_blocks[wi] : 32 * b32_blocks[wi];
            const size_t rb = lm_row_bytes(ty, k);
            void *map;
            size_t map_len;
            uint8_t *rows = before_guard(rb * ROWS, &map, &map_len);
            for (int r = 0; r < ROWS; r++)
                test_row(ty, rows + r * rb, k, &seed);
            lm_tensor w = {"w", ty, {k, ROWS}, rows, LM_LAYOUT_FILE};
            every_path(&w, x, out, &s);
            munmap(map, map_len);
        }
    }
    mm_scratch_free(&s);
}
END_TEST

TCase *tcase_bounds(void)
{
    TCase *tc = tcase_create("bounds");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_matmul_reads_only_its_rows);
    return tc;
}
