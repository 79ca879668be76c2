/*
 * tok/decode.c - token ids back to bytes.  Every token's piece is computed
 * once at load (llama.cpp's token_to_piece with special = true): SPM pieces
 * turn '▁' into spaces and byte tokens into their byte; BPE pieces map
 * GPT-2 code points back to bytes; control and user-defined tokens are their
 * text.  The stream decoder holds back incomplete UTF-8 characters.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                          : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Writes token id's piece to out (at most 4 * len + 4 bytes). */
static size_t piece_of(const tok_vocab *v, int32_t id, char *out)
{
    const tok_entry *t = &v->tok[id];
    if (t->attr & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN | TOK_ATTR_USER_DEFINED)) {
        memcpy(out, t->text, t->len);
        return t->len;
    }
    if (t->attr & TOK_ATTR_BYTE) {
        if (t->len == 6 && hexval(t->text[3]) >= 0 && hexval(t->text[4]) >= 0) {
            out[0] = (char)(hexval(t->text[3]) * 16 + hexval(t->text[4]));
            return 1;
        }
        memcpy(out, t->text, t->len);
        return t->len;
    }
    if (!(t->attr & TOK_ATTR_NORMAL))
        return 0;
    size_t n = 0;
    if (v->kind == TOK_SPM) {
        for (size_t i = 0; i < t->len; i++) {
            if (i + 2 < t->len && !memcmp(t->text + i, "\xe2\x96\x81", 3)) {
                out[n++] = ' ';
                i += 2;
            } else {
                out[n++] = t->text[i];
            }
        }
        return n;
    }
    for (size_t i = 0; i < t->len;) {
        if ((uint8_t)t->text[i] < 0x80) { /* ASCII comes out as itself: its own byte, or kept as UTF-8 */
            out[n++] = t->text[i++];
            continue;
        }
        size_t at = i;
        int b = tok_cpt_to_byte(tok_utf8_next(t->text, t->len, &i));
        if (b >= 0) {
            out[n++] = (char)b;
        } else { /* not a byte-level code point: keep its UTF-8 */
            memcpy(out + n, t->text + at, i - at);
            n += i - at;
        }
    }
    return n;
}

int tok_build_pieces(tok_vocab *v)
{
    size_t total = 0;
    for (int i = 0; i < v->n; i++)
        total += v->tok[i].len;
    v->pieces = malloc(total + 16);
    v->piece_off = malloc(((size_t)v->n + 1) * sizeof *v->piece_off);
    if (!v->pieces || !v->piece_off)
        return -1;
    size_t off = 0;
    for (int i = 0; i < v->n; i++) {
        v->piece_off[i] = off;
        off += piece_of(v, i, v->pieces + off);
    }
    v->piece_off[v->n] = off;
    return 0;
}

const char *tok_piece(const tok_vocab *v, int32_t id, int special, size_t *len)
{
    if (id < 0 || id >= v->n ||
        (!special && (v->tok[id].attr & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)))) {
        *len = 0;
        return "";
    }
    *len = v->piece_off[id + 1] - v->piece_off[id];
    return v->pieces + v->piece_off[id];
}

/* Length of the prefix that ends on a character boundary: a lead byte in
 * the last three whose sequence is still short is held back. */
size_t tok_utf8_complete(const char *s, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t c = (uint8_t)s[n - back];
        if ((c & 0xc0) == 0x80)
            continue;
        size_t want = c >= 0xf0 && c < 0xf8 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc0 && c < 0xe0 ? 2 : 1;
        return want > back ? n - back : n;
    }
    return n;
}

size_t tok_stream_put(tok_stream *s, const char *piece, size_t len, char *out)
{
    size_t n = (size_t)s->n;
    memcpy(out, s->pend, n);
    memcpy(out + n, piece, len);
    n += len;
    size_t keep = n - tok_utf8_complete(out, n);
    if (keep > sizeof s->pend)
        keep = 0;
    memcpy(s->pend, out + n - keep, keep);
    s->n = (int)keep;
    return n - keep;
}

size_t tok_stream_flush(tok_stream *s, char *out)
{
    size_t n = (size_t)s->n;
    memcpy(out, s->pend, n);
    s->n = 0;
    return n;
}
