/*
 * tests/util.c - see util.h.
 */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char *shared_dir(void)
{
    const char *s = getenv("KVCHAT_SHARED");
    return s && *s ? s : "../shared";
}

const char *kvchat_bin(void)
{
    const char *s = getenv("KVCHAT_BIN");
    return s && *s ? s : "./kvchat";
}

char *shared_path(const char *rel)
{
    size_t n = strlen(shared_dir()) + strlen(rel) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", shared_dir(), rel);
    return p;
}

char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    fclose(f);
    b[got] = 0;
    if (len)
        *len = got;
    return b;
}

/* In the run's directory (run_tests.c); a test binary run alone gets one per process. */
char *tmp_path(const char *name)
{
    char dir[4096];
    const char *run = getenv("KVCHAT_TEST_TMP");
    if (run && *run) {
        snprintf(dir, sizeof dir, "%s", run);
    } else {
        snprintf(dir, sizeof dir, "/tmp/kvchat-tests-%d", (int)getpid());
        mkdir(dir, 0700);
    }
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int bad = fwrite(buf, 1, len, f) != len;
    return fclose(f) || bad ? -1 : 0;
}

static char *read_all(int fd)
{
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (n + 1024 > cap)
            b = realloc(b, cap *= 2);
        ssize_t r = read(fd, b + n, cap - n - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    b[n] = 0;
    return b;
}

int run_cmd(char *const argv[], const char *stdin_data, char **out, char **err)
{
    char *op = tmp_path("stdout"), *ep = tmp_path("stderr"), *ip = tmp_path("stdin");
    write_file(ip, stdin_data ? stdin_data : "", stdin_data ? strlen(stdin_data) : 0);
    pid_t pid = fork();
    if (pid == 0) {
        int i = open(ip, O_RDONLY), o = open(op, O_WRONLY | O_CREAT | O_TRUNC, 0600),
            e = open(ep, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(i, 0);
        dup2(o, 1);
        dup2(e, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    int fo = open(op, O_RDONLY), fe = open(ep, O_RDONLY);
    char *so = read_all(fo), *se = read_all(fe);
    close(fo);
    close(fe);
    if (out)
        *out = so;
    else
        free(so);
    if (err)
        *err = se;
    else
        free(se);
    free(op);
    free(ep);
    free(ip);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

/* ---- GGUF writer ---- */

void gb_put(gbuf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

void gb_u32(gbuf *b, uint32_t v) { gb_put(b, &v, 4); }
void gb_u64(gbuf *b, uint64_t v) { gb_put(b, &v, 8); }

void gb_str(gbuf *b, const char *s)
{
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}

static void kv_head(gmodel *m, const char *key, uint32_t type)
{
    gb_str(&m->kv, key);
    gb_u32(&m->kv, type);
    m->n_kv++;
}

void gm_kv_str(gmodel *m, const char *key, const char *val)
{
    kv_head(m, key, GGUF_STRING);
    gb_str(&m->kv, val);
}

void gm_kv_u32(gmodel *m, const char *key, uint32_t v)
{
    kv_head(m, key, GGUF_U32);
    gb_u32(&m->kv, v);
}

void gm_kv_f32(gmodel *m, const char *key, float v)
{
    kv_head(m, key, GGUF_F32);
    gb_put(&m->kv, &v, 4);
}

void gm_kv_bool(gmodel *m, const char *key, int v)
{
    uint8_t b = (uint8_t)(v != 0);
    kv_head(m, key, GGUF_BOOL);
    gb_put(&m->kv, &b, 1);
}

void gm_kv_strs(gmodel *m, const char *key, const char *const *v, int n)
{
    kv_head(m, key, GGUF_ARRAY);
    gb_u32(&m->kv, GGUF_STRING);
    gb_u64(&m->kv, (uint64_t)n);
    for (int i = 0; i < n; i++)
        gb_str(&m->kv, v[i]);
}

void gm_kv_f32s(gmodel *m, const char *key, const float *v, int n)
{
    kv_head(m, key, GGUF_ARRAY);
    gb_u32(&m->kv, GGUF_F32);
    gb_u64(&m->kv, (uint64_t)n);
    gb_put(&m->kv, v, 4 * (size_t)n);
}

void gm_kv_i32s(gmodel *m, const char *key, const int32_t *v, int n)
{
    kv_head(m, key, GGUF_ARRAY);
    gb_u32(&m->kv, GGUF_I32);
    gb_u64(&m->kv, (uint64_t)n);
    gb_put(&m->kv, v, 4 * (size_t)n);
}

void gm_tensor(gmodel *m, const char *name, uint32_t type, int64_t ne0, int64_t ne1,
               const void *data, size_t nbytes)
{
    gtensor *t = &m->t[m->n_t++];
    *t = (gtensor){name, ne1 > 1 ? 2u : 1u, {(uint64_t)ne0, (uint64_t)ne1, 1, 1}, type, data, nbytes};
}

uint8_t *gm_build(const gmodel *m, size_t *len)
{
    gbuf b = {0};
    gb_u32(&b, 0x46554747u);
    gb_u32(&b, 3);
    gb_u64(&b, (uint64_t)m->n_t);
    gb_u64(&b, m->n_kv);
    gb_put(&b, m->kv.p, m->kv.n);
    uint64_t off = 0;
    for (int i = 0; i < m->n_t; i++) {
        const gtensor *t = &m->t[i];
        gb_str(&b, t->name);
        gb_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            gb_u64(&b, t->ne[d]);
        gb_u32(&b, t->type);
        gb_u64(&b, off);
        off += (t->nbytes + 31) / 32 * 32;
    }
    static const uint8_t zeros[32];
    gb_put(&b, zeros, (32 - b.n % 32) % 32);
    for (int i = 0; i < m->n_t; i++) {
        const gtensor *t = &m->t[i];
        gb_put(&b, t->data, t->nbytes);
        gb_put(&b, zeros, (32 - t->nbytes % 32) % 32);
    }
    *len = b.n;
    return b.p;
}

void gm_free(gmodel *m)
{
    free(m->kv.p);
    for (int i = 0; i < m->n_t; i++)
        free((void *)m->t[i].data);
    memset(m, 0, sizeof *m);
}

/* ---- a tiny llama with an SPM byte vocabulary ---- */

static float *rand_f32(size_t n, uint64_t *seed)
{
    float *a = malloc(n * sizeof *a);
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        a[i] = ((float)(*seed >> 40) / (float)(1 << 24) - 0.5f) * 0.5f;
    }
    return a;
}

static float *ones(size_t n)
{
    float *a = malloc(n * sizeof *a);
    for (size_t i = 0; i < n; i++)
        a[i] = 1.0f;
    return a;
}

#define TE 32
#define TL 2
#define TH 4
#define THKV 2
#define TFF 64
#define TV (3 + 256 + 5)

static void tiny_vocab(gmodel *m)
{
    static char bytes[256][8];
    static const char *toks[TV];
    static float scores[TV];
    static int32_t types[TV];
    toks[0] = "<unk>", toks[1] = "<s>", toks[2] = "</s>";
    types[0] = 2, types[1] = 3, types[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[3 + b] = bytes[b];
        types[3 + b] = 6;
    }
    static const char *words[5] = {"\xe2\x96\x81" "the", "\xe2\x96\x81" "cat", "at", "\xe2\x96\x81", "th"};
    for (int i = 0; i < 5; i++) {
        toks[259 + i] = words[i];
        types[259 + i] = 1;
        scores[259 + i] = -(float)i;
    }
    gm_kv_str(m, "tokenizer.ggml.model", "llama");
    gm_kv_strs(m, "tokenizer.ggml.tokens", toks, TV);
    gm_kv_f32s(m, "tokenizer.ggml.scores", scores, TV);
    gm_kv_i32s(m, "tokenizer.ggml.token_type", types, TV);
    gm_kv_u32(m, "tokenizer.ggml.bos_token_id", 1);
    gm_kv_u32(m, "tokenizer.ggml.eos_token_id", 2);
}

uint8_t *tiny_llama(size_t *len, int tied)
{
    return tiny_llama_swa(len, tied, 0);
}

uint8_t *tiny_llama_swa(size_t *len, int tied, int window)
{
    gmodel m = {0};
    uint64_t seed = 42;
    gm_kv_str(&m, "general.architecture", "llama");
    gm_kv_u32(&m, "llama.context_length", 256);
    gm_kv_u32(&m, "llama.embedding_length", TE);
    gm_kv_u32(&m, "llama.block_count", TL);
    gm_kv_u32(&m, "llama.feed_forward_length", TFF);
    gm_kv_u32(&m, "llama.attention.head_count", TH);
    gm_kv_u32(&m, "llama.attention.head_count_kv", THKV);
    gm_kv_f32(&m, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (window)
        gm_kv_u32(&m, "llama.attention.sliding_window", (uint32_t)window);
    tiny_vocab(&m);
    gm_tensor(&m, "token_embd.weight", LM_F32, TE, TV, rand_f32(TE * TV, &seed), 4 * TE * TV);
    gm_tensor(&m, "output_norm.weight", LM_F32, TE, 1, ones(TE), 4 * TE);
    if (!tied)
        gm_tensor(&m, "output.weight", LM_F32, TE, TV, rand_f32(TE * TV, &seed), 4 * TE * TV);
    static char names[TL][9][40];
    int hd = TE / TH;
    for (int l = 0; l < TL; l++) {
        const char *suffix[9] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};
        int64_t shape[9][2] = {{TE, 1}, {TE, TE}, {TE, THKV * hd}, {TE, THKV * hd}, {TE, TE},
                               {TE, 1}, {TE, TFF}, {TE, TFF}, {TFF, TE}};
        for (int k = 0; k < 9; k++) {
            snprintf(names[l][k], sizeof names[l][k], "blk.%d.%s.weight", l, suffix[k]);
            size_t n = (size_t)(shape[k][0] * shape[k][1]);
            float *d = shape[k][1] == 1 ? ones(n) : rand_f32(n, &seed);
            gm_tensor(&m, names[l][k], LM_F32, shape[k][0], shape[k][1], d, 4 * n);
        }
    }
    uint8_t *buf = gm_build(&m, len);
    gm_free(&m);
    return buf;
}

/* ---- children ---- */

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <time.h>

int child_spawn(child *c, char *const argv[], int pty)
{
    int in[2], out[2];
    c->err = -1;
    if (pty) {
        int master;
        struct winsize ws = {40, 120, 0, 0};
        pid_t pid = forkpty(&master, NULL, NULL, &ws);
        if (pid == 0) {
            execv(argv[0], argv);
            _exit(127);
        }
        c->pid = pid;
        c->in = c->out = master;
        return pid > 0 ? 0 : -1;
    }
    if (pipe(in) || pipe(out))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2);
        close(in[1]);
        close(out[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c->pid = pid;
    c->in = in[1];
    c->out = out[0];
    return pid > 0 ? 0 : -1;
}

static double ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int child_read_until(child *c, char **buf, size_t *len, const char *needle, int timeout_ms)
{
    double end = ms_now() + timeout_ms;
    if (!*buf) {
        *buf = calloc(1, 1);
        *len = 0;
    }
    for (;;) {
        if (needle && memmem(*buf, *len, needle, strlen(needle))) /* replies may hold NUL bytes */
            return 1;
        double left = end - ms_now();
        if (left <= 0)
            return 0;
        struct pollfd p = {c->out, POLLIN, 0};
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        char tmp[4096];
        ssize_t r = read(c->out, tmp, sizeof tmp);
        if (r <= 0) /* the end: the buffer is as the check above found it */
            return needle == NULL;
        *buf = realloc(*buf, *len + (size_t)r + 1);
        memcpy(*buf + *len, tmp, (size_t)r);
        *len += (size_t)r;
        (*buf)[*len] = 0;
    }
}

void child_write(child *c, const char *s)
{
    size_t n = strlen(s);
    while (n) {
        ssize_t w = write(c->in, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

int child_wait(child *c)
{
    if (c->in != c->out)
        close(c->in);
    int status = 0;
    char *rest = NULL;
    size_t len;
    child_read_until(c, &rest, &len, NULL, 20000); /* drain until EOF */
    free(rest);
    close(c->out);
    waitpid(c->pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* ---- a model around a real vocabulary ---- */

/* Copies one metadata entry of a parsed file into the model being built. */
static void copy_kv(gmodel *m, const gguf_kv *kv)
{
    static const size_t sz[GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    gb_str(&m->kv, kv->key);
    gb_u32(&m->kv, kv->type);
    m->n_kv++;
    if (kv->type == GGUF_STRING) {
        gb_u64(&m->kv, kv->str_len);
        gb_put(&m->kv, kv->data, kv->str_len);
    } else if (kv->type == GGUF_ARRAY) {
        gb_u32(&m->kv, kv->arr_type);
        gb_u64(&m->kv, kv->arr_n);
        size_t bytes = kv->arr_n * sz[kv->arr_type];
        if (kv->arr_type == GGUF_STRING && kv->arr_n) {
            uint64_t last;
            memcpy(&last, kv->data + kv->str_off[kv->arr_n - 1], 8);
            bytes = kv->str_off[kv->arr_n - 1] + 8 + last;
        }
        gb_put(&m->kv, kv->data, bytes);
    } else {
        gb_put(&m->kv, kv->data, sz[kv->type]);
    }
}

char *model_with_vocab(const char *vocab_rel, const char *name)
{
    char *vp = shared_path(vocab_rel);
    gguf_file g;
    lm_err e;
    if (gguf_open(&g, vp, &e)) {
        free(vp);
        return NULL;
    }
    const gguf_kv *toks = gguf_find(&g, "tokenizer.ggml.tokens");
    int nv = (int)toks->arr_n, E = 32, FF = 64;
    gmodel m = {0};
    uint64_t seed = 7;
    gm_kv_str(&m, "general.architecture", "llama");
    gm_kv_u32(&m, "llama.context_length", 2048);
    gm_kv_u32(&m, "llama.embedding_length", (uint32_t)E);
    gm_kv_u32(&m, "llama.block_count", 1);
    gm_kv_u32(&m, "llama.feed_forward_length", (uint32_t)FF);
    gm_kv_u32(&m, "llama.attention.head_count", 4);
    gm_kv_u32(&m, "llama.attention.head_count_kv", 2);
    for (uint64_t i = 0; i < g.n_kv; i++)
        if (!strncmp(g.kv[i].key, "tokenizer.", 10))
            copy_kv(&m, &g.kv[i]);
    gm_tensor(&m, "token_embd.weight", LM_F32, E, nv, rand_f32((size_t)E * nv, &seed), (size_t)4 * E * nv);
    gm_tensor(&m, "output_norm.weight", LM_F32, E, 1, ones((size_t)E), (size_t)4 * E);
    static const char *const names[9] = {"blk.0.attn_norm.weight", "blk.0.attn_q.weight",
        "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
        "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
        "blk.0.ffn_down.weight"};
    int64_t shape[9][2] = {{E, 1}, {E, E}, {E, E / 2}, {E, E / 2}, {E, E},
                           {E, 1}, {E, FF}, {E, FF}, {FF, E}};
    for (int k = 0; k < 9; k++) {
        size_t n = (size_t)(shape[k][0] * shape[k][1]);
        gm_tensor(&m, names[k], LM_F32, shape[k][0], shape[k][1],
                  shape[k][1] == 1 ? ones(n) : rand_f32(n, &seed), 4 * n);
    }
    size_t len;
    uint8_t *buf = gm_build(&m, &len);
    char *out = tmp_path(name);
    write_file(out, buf, len);
    free(buf);
    gm_free(&m);
    gguf_close(&g);
    free(vp);
    return out;
}
