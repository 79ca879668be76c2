/*
 * lm/gguf.c - GGUF v2/v3 parser.  The file is mapped read-only and every
 * read goes through a cursor that checks the remaining length first, in the
 * manner of antirez's gguflib: a hostile file can make us fail, never read
 * outside the mapping.  Keys and tensor names are copied (they are small);
 * string arrays such as the vocabulary stay in the mapping and get an index
 * of offsets so element i is found in O(1).  Tensor data is validated here
 * (inside the file, aligned, no overlap) and then used in place.
 */
#include "lm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define MAX_NAME 65536
#define MAX_NEST 8

void lm_seterr(lm_err *e, const char *fmt, ...)
{
    if (!e)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}

typedef struct cursor {
    const uint8_t *buf;
    size_t size, pos;
    const char *name;
    lm_err *e;
} cursor;

static int need(cursor *c, uint64_t n, const char *what)
{
    if (n > c->size - c->pos) {
        lm_seterr(c->e, "%s: %s at offset %zu needs %llu bytes, only %zu left (truncated file?)",
                  c->name, what, c->pos, (unsigned long long)n, c->size - c->pos);
        return -1;
    }
    return 0;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what)
{
    if (need(c, 4, what))
        return -1;
    memcpy(v, c->buf + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what)
{
    if (need(c, 8, what))
        return -1;
    memcpy(v, c->buf + c->pos, 8);
    c->pos += 8;
    return 0;
}

/* A string: u64 length then bytes.  Returns a pointer into the buffer. */
static int rd_str(cursor *c, const uint8_t **s, uint64_t *len, const char *what)
{
    size_t at = c->pos;
    if (rd_u64(c, len, what))
        return -1;
    if (*len > c->size - c->pos) {
        lm_seterr(c->e, "%s: %s at offset %zu has length %llu past end of file %zu",
                  c->name, what, at, (unsigned long long)*len, c->size);
        return -1;
    }
    *s = c->buf + c->pos;
    c->pos += *len;
    return 0;
}

static char *dup_name(cursor *c, const char *what)
{
    const uint8_t *s;
    uint64_t len;
    size_t at = c->pos;
    if (rd_str(c, &s, &len, what))
        return NULL;
    if (len > MAX_NAME || memchr(s, 0, len)) {
        lm_seterr(c->e, "%s: %s at offset %zu is not a valid name (length %llu)", c->name, what,
                  at, (unsigned long long)len);
        return NULL;
    }
    char *r = malloc(len + 1);
    if (!r) {
        lm_seterr(c->e, "%s: out of memory", c->name);
        return NULL;
    }
    memcpy(r, s, len);
    r[len] = 0;
    return r;
}

static const size_t scalar_size[GGUF_NTYPES] = {
    [GGUF_U8] = 1, [GGUF_I8] = 1, [GGUF_U16] = 2, [GGUF_I16] = 2, [GGUF_U32] = 4,
    [GGUF_I32] = 4, [GGUF_F32] = 4, [GGUF_BOOL] = 1, [GGUF_U64] = 8, [GGUF_I64] = 8,
    [GGUF_F64] = 8,
};

const char *gguf_type_name(uint32_t t)
{
    static const char *n[GGUF_NTYPES] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                         "bool", "string", "array", "u64", "i64", "f64"};
    return t < GGUF_NTYPES ? n[t] : "unknown";
}

static int skip_value(cursor *c, uint32_t type, int depth, const char *key);

/* Skips an array body: element type, count, elements. */
static int skip_array(cursor *c, int depth, const char *key, uint32_t *etype, uint64_t *n)
{
    if (depth > MAX_NEST) {
        lm_seterr(c->e, "%s: key '%s': arrays nested deeper than %d", c->name, key, MAX_NEST);
        return -1;
    }
    if (rd_u32(c, etype, "array type") || rd_u64(c, n, "array length"))
        return -1;
    if (*etype >= GGUF_NTYPES) {
        lm_seterr(c->e, "%s: key '%s': unknown array element type %u at offset %zu", c->name,
                  key, *etype, c->pos - 12);
        return -1;
    }
    if (*etype != GGUF_STRING && *etype != GGUF_ARRAY) {
        uint64_t sz = scalar_size[*etype];
        if (*n > (c->size - c->pos) / sz) {
            lm_seterr(c->e, "%s: key '%s': array of %llu %s at offset %zu runs past end of file %zu",
                      c->name, key, (unsigned long long)*n, gguf_type_name(*etype), c->pos,
                      c->size);
            return -1;
        }
        c->pos += *n * sz;
        return 0;
    }
    /* each element takes at least 8 bytes: reject absurd counts up front */
    if (*n > (c->size - c->pos) / 8) {
        lm_seterr(c->e, "%s: key '%s': array count %llu at offset %zu exceeds the file size",
                  c->name, key, (unsigned long long)*n, c->pos);
        return -1;
    }
    for (uint64_t i = 0; i < *n; i++)
        if (skip_value(c, *etype, depth + 1, key))
            return -1;
    return 0;
}

static int skip_value(cursor *c, uint32_t type, int depth, const char *key)
{
    if (type == GGUF_STRING) {
        const uint8_t *s;
        uint64_t len;
        return rd_str(c, &s, &len, "string value");
    }
    if (type == GGUF_ARRAY) {
        uint32_t et;
        uint64_t n;
        return skip_array(c, depth, key, &et, &n);
    }
    if (type >= GGUF_NTYPES) {
        lm_seterr(c->e, "%s: key '%s': unknown value type %u", c->name, key, type);
        return -1;
    }
    if (need(c, scalar_size[type], "value"))
        return -1;
    c->pos += scalar_size[type];
    return 0;
}

/* Builds the offset index of a string array (already validated). */
static int index_strings(cursor *c, gguf_kv *kv)
{
    kv->str_off = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof *kv->str_off);
    if (!kv->str_off) {
        lm_seterr(c->e, "%s: out of memory", c->name);
        return -1;
    }
    uint64_t off = 0;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        uint64_t len;
        kv->str_off[i] = off;
        memcpy(&len, kv->data + off, 8);
        off += 8 + len;
    }
    return 0;
}

static int read_kv(cursor *c, gguf_kv *kv)
{
    kv->key = dup_name(c, "metadata key");
    if (!kv->key)
        return -1;
    if (rd_u32(c, &kv->type, "value type"))
        return -1;
    if (kv->type >= GGUF_NTYPES) {
        lm_seterr(c->e, "%s: key '%s': unknown value type %u at offset %zu", c->name, kv->key,
                  kv->type, c->pos - 4);
        return -1;
    }
    if (kv->type == GGUF_STRING) {
        if (rd_str(c, &kv->data, &kv->str_len, "string value"))
            return -1;
        return 0;
    }
    if (kv->type == GGUF_ARRAY) {
        size_t start = c->pos + 12;
        if (skip_array(c, 0, kv->key, &kv->arr_type, &kv->arr_n))
            return -1;
        kv->data = c->buf + start;
        if (kv->arr_type == GGUF_STRING)
            return index_strings(c, kv);
        return 0;
    }
    kv->data = c->buf + c->pos;
    return skip_value(c, kv->type, 0, kv->key);
}

static int read_tensor_info(cursor *c, gguf_tensor *t)
{
    t->name = dup_name(c, "tensor name");
    if (!t->name)
        return -1;
    if (rd_u32(c, &t->n_dims, "tensor dimension count"))
        return -1;
    if (t->n_dims == 0 || t->n_dims > LM_MAX_DIMS) {
        lm_seterr(c->e, "%s: tensor '%s' has %u dimensions (1 to %d allowed)", c->name, t->name,
                  t->n_dims, LM_MAX_DIMS);
        return -1;
    }
    uint64_t total = 1;
    for (int i = 0; i < LM_MAX_DIMS; i++)
        t->ne[i] = 1;
    for (uint32_t i = 0; i < t->n_dims; i++) {
        uint64_t d;
        if (rd_u64(c, &d, "tensor dimension"))
            return -1;
        if (d == 0 || d > (uint64_t)INT64_MAX || total > (uint64_t)INT64_MAX / d) {
            lm_seterr(c->e, "%s: tensor '%s' dimension %u is %llu (zero or overflowing)", c->name,
                      t->name, i, (unsigned long long)d);
            return -1;
        }
        total *= d;
        t->ne[i] = (int64_t)d;
    }
    if (rd_u32(c, &t->type, "tensor type") || rd_u64(c, &t->offset, "tensor offset"))
        return -1;
    if (!lm_type_known(t->type)) {
        lm_seterr(c->e, "%s: tensor '%s' has unknown type %u", c->name, t->name, t->type);
        return -1;
    }
    int64_t blk = lm_type_block(t->type);
    if (t->ne[0] % blk) {
        lm_seterr(c->e, "%s: tensor '%s' row length %lld is not a multiple of the %s block size %lld",
                  c->name, t->name, (long long)t->ne[0], lm_type_name(t->type), (long long)blk);
        return -1;
    }
    uint64_t blocks = total / (uint64_t)blk;
    if (blocks > UINT64_MAX / lm_type_size(t->type)) {
        lm_seterr(c->e, "%s: tensor '%s' size overflows", c->name, t->name);
        return -1;
    }
    t->nbytes = blocks * lm_type_size(t->type);
    return 0;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Tensor data: inside the file, aligned, and no two tensors overlap. */
static int place_tensors(gguf_file *g, lm_err *e)
{
    uint64_t avail = g->size - g->data_off;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment) {
            lm_seterr(e, "%s: tensor '%s' offset %llu is not a multiple of the alignment %llu",
                      g->path, t->name, (unsigned long long)t->offset,
                      (unsigned long long)g->alignment);
            return -1;
        }
        if (t->offset > avail || t->nbytes > avail - t->offset) {
            lm_seterr(e, "%s: tensor '%s' data ends at %llu past end of file %zu", g->path,
                      t->name, (unsigned long long)(g->data_off + t->offset + t->nbytes), g->size);
            return -1;
        }
        t->data = g->map + g->data_off + t->offset;
    }
    if (g->n_tensors < 2)
        return 0;
    gguf_tensor **order = malloc(g->n_tensors * sizeof *order);
    if (!order) {
        lm_seterr(e, "%s: out of memory", g->path);
        return -1;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        order[i] = &g->tensors[i];
    qsort(order, g->n_tensors, sizeof *order, cmp_by_offset);
    int rc = 0;
    for (uint64_t i = 1; i < g->n_tensors && !rc; i++) {
        if (order[i - 1]->offset + order[i - 1]->nbytes > order[i]->offset) {
            lm_seterr(e, "%s: tensors '%s' and '%s' overlap", g->path, order[i - 1]->name,
                      order[i]->name);
            rc = -1;
        }
    }
    free(order);
    return rc;
}

static int check_names_unique(gguf_file *g, lm_err *e)
{
    /* quadratic only in the worst case of a tiny file; real files have < 2000 tensors */
    for (uint64_t i = 0; i < g->n_tensors; i++)
        for (uint64_t j = i + 1; j < g->n_tensors; j++)
            if (!strcmp(g->tensors[i].name, g->tensors[j].name)) {
                lm_seterr(e, "%s: tensor '%s' appears twice", g->path, g->tensors[i].name);
                return -1;
            }
    return 0;
}

static int read_alignment(gguf_file *g, lm_err *e)
{
    g->alignment = 32;
    const gguf_kv *kv = gguf_find(g, "general.alignment");
    if (!kv)
        return 0;
    uint32_t a;
    if (kv->type != GGUF_U32) {
        lm_seterr(e, "%s: general.alignment has type %s, expected u32", g->path,
                  gguf_type_name(kv->type));
        return -1;
    }
    memcpy(&a, kv->data, 4);
    if (a == 0 || (a & (a - 1))) {
        lm_seterr(e, "%s: general.alignment %u is not a power of two", g->path, a);
        return -1;
    }
    g->alignment = a;
    return 0;
}

int gguf_parse(gguf_file *g, const char *name, const uint8_t *buf, size_t size, lm_err *e)
{
    memset(g, 0, sizeof *g);
    g->path = strdup(name);
    g->map = buf;
    g->size = size;
    cursor c = {buf, size, 0, g->path, e};
    uint32_t magic;
    if (rd_u32(&c, &magic, "magic"))
        return -1;
    if (magic != GGUF_MAGIC) {
        lm_seterr(e, "%s: not a GGUF file (magic 0x%08x at offset 0)", name, magic);
        return -1;
    }
    if (rd_u32(&c, &g->version, "version"))
        return -1;
    if (g->version != 2 && g->version != 3) {
        lm_seterr(e, "%s: GGUF version %u is not supported (2 and 3 are)", name, g->version);
        return -1;
    }
    if (rd_u64(&c, &g->n_tensors, "tensor count") || rd_u64(&c, &g->n_kv, "metadata count"))
        return -1;
    /* every kv takes >= 12 bytes and every tensor info >= 24: bound counts by the file */
    if (g->n_kv > size / 12 || g->n_tensors > size / 24) {
        lm_seterr(e, "%s: header claims %llu metadata entries and %llu tensors, more than a %zu-byte file can hold",
                  name, (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, size);
        return -1;
    }
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        lm_seterr(e, "%s: out of memory", name);
        return -1;
    }
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (read_kv(&c, &g->kv[i]))
            return -1;
    if (read_alignment(g, e))
        return -1;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (read_tensor_info(&c, &g->tensors[i]))
            return -1;
    uint64_t off = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors && off > size) {
        lm_seterr(e, "%s: data section at %llu starts past end of file %zu", name,
                  (unsigned long long)off, size);
        return -1;
    }
    g->data_off = off > size ? size : off;
    if (check_names_unique(g, e))
        return -1;
    return place_tensors(g, e);
}

int gguf_open(gguf_file *g, const char *path, lm_err *e)
{
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        lm_seterr(e, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        lm_seterr(e, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    if (st.st_size < 8) {
        lm_seterr(e, "%s: file of %lld bytes is too small to be GGUF", path,
                  (long long)st.st_size);
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        lm_seterr(e, "%s: mmap: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    int rc = gguf_parse(g, path, map, (size_t)st.st_size, e);
    g->mapped = 1;
    g->fd = fd;
    if (rc)
        gguf_close(g);
    return rc;
}

void gguf_close(gguf_file *g)
{
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) {
            free(g->kv[i].key);
            free(g->kv[i].str_off);
        }
    if (g->tensors)
        for (uint64_t i = 0; i < g->n_tensors; i++)
            free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(g->path);
    if (g->mapped) { /* gguf_open's: the map and the file it keeps open */
        if (g->map)
            munmap((void *)g->map, g->size);
        close(g->fd);
    }
    g->map = NULL;
    g->mapped = 0;
    g->kv = NULL;
    g->tensors = NULL;
    g->path = NULL;
}

const gguf_kv *gguf_find(const gguf_file *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key && !strcmp(g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name))
            return &g->tensors[i];
    return NULL;
}

static int wrong_type(const gguf_file *g, const gguf_kv *kv, const char *want, lm_err *e)
{
    lm_seterr(e, "%s: key '%s' has type %s, expected %s", g->path, kv->key,
              gguf_type_name(kv->type), want);
    return -1;
}

int gguf_get_u32(const gguf_file *g, const char *key, uint32_t *out, lm_err *e)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv)
        return 0;
    int64_t v;
    switch (kv->type) {
    case GGUF_U8: v = kv->data[0]; break;
    case GGUF_I8: v = (int8_t)kv->data[0]; break;
    case GGUF_U16: { uint16_t x; memcpy(&x, kv->data, 2); v = x; break; }
    case GGUF_I16: { int16_t x; memcpy(&x, kv->data, 2); v = x; break; }
    case GGUF_U32: { uint32_t x; memcpy(&x, kv->data, 4); v = x; break; }
    case GGUF_I32: { int32_t x; memcpy(&x, kv->data, 4); v = x; break; }
    case GGUF_U64: { uint64_t x; memcpy(&x, kv->data, 8); v = x > INT64_MAX ? -1 : (int64_t)x; break; }
    case GGUF_I64: { int64_t x; memcpy(&x, kv->data, 8); v = x; break; }
    default: return wrong_type(g, kv, "an integer", e);
    }
    if (v < 0 || v > UINT32_MAX) {
        lm_seterr(e, "%s: key '%s' value %lld is out of range", g->path, key, (long long)v);
        return -1;
    }
    *out = (uint32_t)v;
    return 1;
}

int gguf_get_f32(const gguf_file *g, const char *key, float *out, lm_err *e)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv)
        return 0;
    if (kv->type == GGUF_F32) {
        memcpy(out, kv->data, 4);
    } else if (kv->type == GGUF_F64) {
        double d;
        memcpy(&d, kv->data, 8);
        *out = (float)d;
    } else {
        uint32_t u;
        int r = gguf_get_u32(g, key, &u, e);
        if (r != 1)
            return wrong_type(g, kv, "a number", e);
        *out = (float)u;
    }
    return 1;
}

int gguf_get_bool(const gguf_file *g, const char *key, int *out, lm_err *e)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv)
        return 0;
    if (kv->type != GGUF_BOOL)
        return wrong_type(g, kv, "bool", e);
    *out = kv->data[0] != 0;
    return 1;
}

int gguf_get_str(const gguf_file *g, const char *key, const char **s, size_t *len, lm_err *e)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv)
        return 0;
    if (kv->type != GGUF_STRING)
        return wrong_type(g, kv, "string", e);
    *s = (const char *)kv->data;
    *len = kv->str_len;
    return 1;
}

const char *gguf_arr_str(const gguf_kv *kv, uint64_t i, size_t *len)
{
    uint64_t l;
    memcpy(&l, kv->data + kv->str_off[i], 8);
    *len = l;
    return (const char *)kv->data + kv->str_off[i] + 8;
}
