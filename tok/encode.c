/*
 * tok/encode.c - text to token ids.  First the special-token partition
 * (llama.cpp's tokenizer_st_partition): the text is cut at every occurrence
 * of a special token's text, longest tokens first; control tokens only when
 * parse_special is on, user-defined ones always.  The raw fragments left
 * over go to the SentencePiece or BPE merger: both repeatedly merge the best
 * adjacent pair (highest score / lowest merge rank, leftmost on ties) using a
 * binary heap, then map the final symbols to ids with byte fallback.
 */
#include "internal.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

int tok_out_push(tok_out *o, int32_t id)
{
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 64;
        int32_t *p = realloc(o->ids, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        o->ids = p;
        o->cap = cap;
    }
    o->ids[o->n++] = id;
    return 0;
}

/* ---- symbol chains and the merge heap, shared by SPM and BPE ---- */

typedef struct sym {
    size_t start, n;
    int prev, next;
    int32_t id;       /* BPE: the token its text is, or -1 */
} sym;

typedef struct pair {
    int left, right;
    float score;      /* SPM: higher first; BPE: -rank */
    size_t size;
} pair;

typedef struct heap {
    pair *a;
    int n, cap;
} heap;

/* a ranks before b: better score, then leftmost */
static int pair_before(const pair *a, const pair *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int heap_push(heap *h, pair p)
{
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 64;
        pair *a = realloc(h->a, (size_t)cap * sizeof *a);
        if (!a)
            return -1;
        h->a = a;
        h->cap = cap;
    }
    int i = h->n++;
    while (i > 0 && pair_before(&p, &h->a[(i - 1) / 2])) {
        h->a[i] = h->a[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->a[i] = p;
    return 0;
}

static pair heap_pop(heap *h)
{
    pair top = h->a[0], last = h->a[--h->n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && pair_before(&h->a[c + 1], &h->a[c]))
            c++;
        if (!pair_before(&h->a[c], &last))
            break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n)
        h->a[i] = last;
    return top;
}

typedef struct merger {
    const tok_vocab *v;
    const char *text;
    sym *s;
    int n;
    heap h;
} merger;

/* Splits text into one symbol per UTF-8 character (lead-byte length). */
static int split_chars(merger *m, size_t len)
{
    m->s = malloc((len ? len : 1) * sizeof *m->s);
    if (!m->s)
        return -1;
    m->n = 0;
    const int bpe = m->v->kind == TOK_BPE;
    for (size_t off = 0; off < len;) {
        uint8_t c = (uint8_t)m->text[off];
        size_t cl = c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
        if (cl > len - off)
            cl = len - off;
        int32_t id = bpe ? tok_lookup(m->v, m->text + off, cl) : -1;
        m->s[m->n] = (sym){off, cl, m->n - 1, off + cl == len ? -1 : m->n + 1, id};
        m->n++;
        off += cl;
    }
    return 0;
}

static int try_pair(merger *m, int left, int right)
{
    if (left < 0 || right < 0)
        return 0;
    const sym *a = &m->s[left], *b = &m->s[right];
    pair p = {left, right, 0, a->n + b->n};
    if (m->v->kind == TOK_SPM) {
        int32_t id = tok_lookup(m->v, m->text + a->start, p.size);
        if (id < 0)
            return 0;
        p.score = m->v->tok[id].score;
    } else {
        int32_t r = tok_merge_rank(m->v, a->id, b->id);
        if (r < 0)
            return 0;
        p.score = -(float)r;
    }
    return heap_push(&m->h, p);
}

static int run_merges(merger *m)
{
    for (int i = 1; i < m->n; i++)
        if (try_pair(m, i - 1, i))
            return -1;
    while (m->h.n) {
        pair p = heap_pop(&m->h);
        sym *a = &m->s[p.left], *b = &m->s[p.right];
        if (a->n == 0 || b->n == 0 || a->n + b->n != p.size)
            continue; /* stale: one side was merged since */
        a->n += b->n;
        b->n = 0;
        if (m->v->kind == TOK_BPE)
            a->id = tok_lookup(m->v, m->text + a->start, a->n);
        a->next = b->next;
        if (b->next >= 0)
            m->s[b->next].prev = p.left;
        if (try_pair(m, a->prev, p.left) || try_pair(m, p.left, a->next))
            return -1;
    }
    return 0;
}

/* Emits the final symbols: a token when the text is one, else its bytes. */
static int emit(merger *m, tok_out *o)
{
    for (int i = 0; i < m->n && i >= 0; i = m->s[i].next) {
        const sym *s = &m->s[i];
        if (s->n == 0)
            continue;
        int32_t id = m->v->kind == TOK_BPE ? s->id : tok_lookup(m->v, m->text + s->start, s->n);
        if (id >= 0) {
            if (tok_out_push(o, id))
                return -1;
            continue;
        }
        for (size_t k = 0; k < s->n; k++) {
            int32_t b = m->v->byte_tok[(uint8_t)m->text[s->start + k]];
            if (b < 0 && m->v->kind == TOK_SPM)
                b = m->v->unk;
            if (b >= 0 && tok_out_push(o, b))
                return -1;
        }
    }
    return 0;
}

static int merge_and_emit(const tok_vocab *v, const char *text, size_t len, tok_out *o)
{
    merger m = {v, text, NULL, 0, {0}};
    int rc = split_chars(&m, len) || run_merges(&m) || emit(&m, o) ? -1 : 0;
    free(m.s);
    free(m.h.a);
    return rc;
}

int spm_encode(const tok_vocab *v, const char *text, size_t len, tok_out *o)
{
    if (len == 0)
        return 0;
    return merge_and_emit(v, text, len, o);
}

/* Re-encodes text as valid UTF-8 (invalid bytes -> U+FFFD, as llama.cpp); code
 * points UTF-8 cannot carry (surrogates, above U+10FFFF) also become U+FFFD,
 * since the regex engine is promised valid UTF-8. */
static char *sanitize_utf8(const char *text, size_t len, size_t *out_len)
{
    char *s = malloc(3 * len + 1);
    if (!s)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t c = tok_utf8_next(text, len, &i);
        if ((c >= 0xd800 && c <= 0xdfff) || c > 0x10ffff)
            c = 0xfffd;
        n += tok_utf8_put(c, s + n);
    }
    *out_len = n;
    return s;
}

/* Maps a word's bytes to GPT-2's printable code points. */
static char *byte_encode(const char *w, size_t len, size_t *out_len)
{
    char *s = malloc(2 * len + 1);
    if (!s)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += tok_byte_to_utf8((uint8_t)w[i], s + n);
    *out_len = n;
    return s;
}

static int bpe_word(const tok_vocab *v, const char *w, size_t len, tok_out *o)
{
    size_t elen;
    char *enc = byte_encode(w, len, &elen);
    if (!enc)
        return -1;
    int32_t whole = v->ignore_merges ? tok_lookup(v, enc, elen) : -1;
    int rc = whole >= 0 ? tok_out_push(o, whole) : merge_and_emit(v, enc, elen, o);
    free(enc);
    return rc;
}

/* A word's ids from words when noted there, else merged (and noted). */
static int bpe_word_memo(const tok_vocab *v, const char *w, size_t len, word_memo *words,
                         tok_out *o)
{
    int n, first = o->n;
    const int32_t *ids = words ? word_memo_get(words, w, len, &n) : NULL;
    if (ids) {
        for (int j = 0; j < n; j++)
            if (tok_out_push(o, ids[j]))
                return -1;
        return 0;
    }
    if (bpe_word(v, w, len, o))
        return -1;
    if (words)
        word_memo_put(words, w, len, o->ids + first, o->n - first);
    return 0;
}

int bpe_encode(const tok_vocab *v, const char *text, size_t len, word_memo *words, tok_out *o)
{
    size_t clen, *starts = NULL, *lens = NULL;
    int n = 0, rc = -1;
    char *clean = sanitize_utf8(text, len, &clen);
    if (!clean || pretok_split(&v->pre, clean, clen, &starts, &lens, &n))
        goto out;
    rc = 0;
    for (int i = 0; i < n && !rc; i++)
        if (lens[i])
            rc = bpe_word_memo(v, clean + starts[i], lens[i], words, o);
out:
    free(clean);
    free(starts);
    free(lens);
    return rc;
}

/* ---- special-token partition ---- */

typedef struct frag {
    int32_t token;    /* -1: raw text [off, off+len) */
    size_t off, len;
} frag;

typedef struct frags {
    frag *a;
    int n, cap;
} frags;

static int frag_push(frags *f, frag x)
{
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 16;
        frag *a = realloc(f->a, (size_t)cap * sizeof *a);
        if (!a)
            return -1;
        f->a = a;
        f->cap = cap;
    }
    f->a[f->n++] = x;
    return 0;
}

/* Cuts one raw fragment at every occurrence of special token id. */
static int cut_fragment(const tok_vocab *v, const char *text, frag f, int32_t id, frags *out)
{
    const tok_entry *t = &v->tok[id];
    size_t off = f.off, len = f.len;
    while (len >= t->len) {
        const char *hit = memmem(text + off, len, t->text, t->len);
        if (!hit)
            break;
        size_t at = (size_t)(hit - text), left = at - off;
        if (t->attr & TOK_ATTR_LSTRIP)
            while (left > 0 && isspace((unsigned char)text[off + left - 1]))
                left--;
        if (left && frag_push(out, (frag){-1, off, left}))
            return -1;
        if (frag_push(out, (frag){id, 0, 0}))
            return -1;
        size_t end = off + len;
        off = at + t->len;
        if (t->attr & TOK_ATTR_RSTRIP)
            while (off < end && isspace((unsigned char)text[off]))
                off++;
        len = end - off;
    }
    if (len && frag_push(out, (frag){-1, off, len}))
        return -1;
    return 0;
}

static int partition(const tok_vocab *v, const char *text, size_t len, int parse_special, frags *f)
{
    frags next = {0};
    if (len && frag_push(f, (frag){-1, 0, len}))
        return -1;
    for (int s = 0; s < v->n_special; s++) {
        int32_t id = v->special[s];
        if (!parse_special && (v->tok[id].attr & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)))
            continue;
        next.n = 0;
        for (int i = 0; i < f->n; i++) {
            int rc = f->a[i].token >= 0 ? frag_push(&next, f->a[i])
                                        : cut_fragment(v, text, f->a[i], id, &next);
            if (rc) {
                free(next.a);
                return -1;
            }
        }
        frags t = *f;
        *f = next;
        next = t;
    }
    free(next.a);
    return 0;
}

/* SPM fragments get a leading space after BOS/special tokens and '▁' for spaces. */
static int spm_fragment(const tok_vocab *v, const char *s, size_t len, int prefix, tok_out *o)
{
    size_t n = 0;
    char *buf = malloc(3 * (len + 1));
    if (!buf)
        return -1;
    if (prefix) {
        memcpy(buf, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(buf + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            buf[n++] = s[i];
        }
    }
    int rc = spm_encode(v, buf, n, o);
    free(buf);
    return rc;
}

/* A fragment as encoded: where its ids went, and its SentencePiece prefix flag. */
typedef struct memo_frag {
    frag f;
    int prefix, first, n;
} memo_frag;

/*
 * The fragments of the last text tokenized through a memo and their ids.
 * Fragments are encoded independently of each other, so one that repeats
 * byte for byte at the same place (with the same prefix flag) gets the
 * same ids: a chat's conversation is re-tokenized every turn, and all but
 * the newest messages are such repeats.  A fragment that is new (the whole
 * conversation, without a template) still finds its BPE words in words.
 */
struct tok_memo {
    const tok_vocab *v;
    int parse_special;
    char *text;
    memo_frag *mf;
    int nf;
    int32_t *ids;
    int reused; /* fragments of the last call taken from here */
    word_memo *words;
};

tok_memo *tok_memo_new(void)
{
    tok_memo *m = calloc(1, sizeof *m);
    if (m && !(m->words = word_memo_new())) {
        free(m);
        return NULL;
    }
    return m;
}

static void memo_clear(tok_memo *m)
{
    free(m->text);
    free(m->mf);
    free(m->ids);
    m->text = NULL, m->mf = NULL, m->ids = NULL, m->nf = 0;
}

void tok_memo_free(tok_memo *m)
{
    if (m) {
        memo_clear(m);
        word_memo_free(m->words);
    }
    free(m);
}

int tok_memo_reused(const tok_memo *m) { return m ? m->reused : 0; }

/* The memo's ids for fragment i of text, or NULL when that fragment differs. */
static const memo_frag *memo_hit(const tok_memo *m, const char *text, int i, const frag *x,
                                 int prefix)
{
    if (!m || i >= m->nf)
        return NULL;
    const memo_frag *e = &m->mf[i];
    if (e->f.token != -1 || e->f.len != x->len || e->prefix != prefix ||
        memcmp(m->text + e->f.off, text + x->off, x->len))
        return NULL;
    return e;
}

/* Makes text, its fragments and ids the memo's; on no memory the memo is just emptied. */
static void memo_keep(tok_memo *m, int parse_special, const char *text, size_t len,
                      memo_frag *mf, int nf, const tok_out *o)
{
    memo_clear(m);
    m->parse_special = parse_special;
    m->text = malloc(len ? len : 1);
    m->ids = malloc((o->n ? (size_t)o->n : 1) * sizeof *m->ids);
    if (!m->text || !m->ids) {
        free(mf);
        memo_clear(m);
        return;
    }
    if (len) /* (an empty text has no ids array at all) */
        memcpy(m->text, text, len);
    if (o->n)
        memcpy(m->ids, o->ids, (size_t)o->n * sizeof *m->ids);
    m->mf = mf, m->nf = nf;
}

static int encode_fragment(const tok_vocab *v, const char *text, const frag *x, int prefix,
                           word_memo *words, tok_out *o)
{
    if (x->token >= 0)
        return tok_out_push(o, x->token);
    if (v->kind == TOK_SPM)
        return spm_fragment(v, text + x->off, x->len, prefix, o);
    return bpe_encode(v, text + x->off, x->len, words, o);
}

/* memo: the last text's fragments to reuse (or NULL); rec: where to note this text's. */
static int encode_fragments(const tok_vocab *v, const char *text, const frags *f, tok_out *o,
                            tok_memo *memo, memo_frag *rec)
{
    int prev_special = 1;
    for (int i = 0; i < f->n; i++) {
        const frag *x = &f->a[i];
        int prefix = x->token < 0 && v->kind == TOK_SPM && v->add_space_prefix && prev_special;
        int first = o->n;
        const memo_frag *hit = x->token < 0 ? memo_hit(memo, text, i, x, prefix) : NULL;
        if (hit) {
            for (int j = 0; j < hit->n; j++)
                if (tok_out_push(o, memo->ids[hit->first + j]))
                    return -1;
            memo->reused++;
        } else if (encode_fragment(v, text, x, prefix, memo ? memo->words : NULL, o)) {
            return -1;
        }
        if (v->kind == TOK_SPM)
            prev_special = x->token >= 0;
        if (rec)
            rec[i] = (memo_frag){*x, prefix, first, o->n - first};
    }
    return 0;
}

int tok_encode(const tok_vocab *v, const char *text, size_t len, int add_special,
               int parse_special, int32_t **out, int *n_out, lm_err *e)
{
    return tok_encode_memo(v, NULL, text, len, add_special, parse_special, out, n_out, e);
}

int tok_encode_memo(const tok_vocab *v, tok_memo *memo, const char *text, size_t len,
                    int add_special, int parse_special, int32_t **out, int *n_out, lm_err *e)
{
    tok_out o = {0};
    frags f = {0};
    memo_frag *rec = NULL;
    if (memo && memo->v != v) { /* every id it holds is the vocab's */
        memo_clear(memo);
        word_memo_clear(memo->words);
        memo->v = v;
    }
    if (memo && memo->parse_special != parse_special)
        memo_clear(memo);
    if (memo)
        memo->reused = 0;
    int rc = partition(v, text, len, parse_special, &f);
    if (!rc && memo)
        rec = malloc((f.n ? (size_t)f.n : 1) * sizeof *rec); /* none: no memo kept */
    if (!rc && add_special && v->add_bos)
        rc = tok_out_push(&o, v->bos);
    if (!rc)
        rc = encode_fragments(v, text, &f, &o, rec ? memo : NULL, rec);
    if (!rc && add_special && v->add_eos)
        rc = tok_out_push(&o, v->eos);
    if (!rc && rec)
        memo_keep(memo, parse_special, text, len, rec, f.n, &o);
    else
        free(rec);
    free(f.a);
    if (rc) {
        free(o.ids);
        lm_seterr(e, "out of memory while tokenizing %zu bytes", len);
        return -1;
    }
    *out = o.ids;
    *n_out = o.n;
    return 0;
}
