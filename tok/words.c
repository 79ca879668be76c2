/*
 * tok/words.c - a memo of byte-level BPE words and their ids.  After the
 * pre-tokenizer, BPE merges inside one word only, so a word's ids are a
 * function of its bytes alone.  A chat without a template is one fragment
 * that grows every turn, so the fragment memo of encode.c cannot help it;
 * this one makes the words it has seen cost a hash lookup instead of a merge
 * run (about 0.3 us a word, 0.2 ms a turn at 700 words).
 *
 * Open addressing with linear probing over a power-of-two table, the words'
 * bytes and ids in two growing arenas.  When it would outgrow WORDS_MAX
 * entries or WORDS_BYTES of words it starts over empty: a cache, never a
 * cause of a wrong id.  Words longer than WORD_LONGEST are not kept (a
 * hostile text of one huge word would otherwise be held twice).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define WORDS_MAX (1 << 16)
#define WORDS_BYTES (4u << 20)
#define WORD_LONGEST 256

typedef struct word_slot {
    uint64_t hash;
    uint32_t key_off, key_len; /* key_len 0: empty slot */
    uint32_t ids_off, n_ids;
} word_slot;

struct word_memo {
    word_slot *slot;
    uint32_t cap, used; /* slots, and those holding a word */
    char *bytes;
    size_t n_bytes, cap_bytes;
    int32_t *ids;
    size_t n_ids, cap_ids;
};

word_memo *word_memo_new(void) { return calloc(1, sizeof(word_memo)); }

void word_memo_free(word_memo *m)
{
    if (!m)
        return;
    free(m->slot);
    free(m->bytes);
    free(m->ids);
    free(m);
}

/* FNV-1a: words are short, and any spread of their bytes will do. */
static uint64_t word_hash(const char *w, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)w[i]) * 0x100000001b3ull;
    return h;
}

/* The slot holding w, or the empty one where it would go. */
static word_slot *word_find(const word_memo *m, const char *w, size_t len, uint64_t h)
{
    for (uint32_t i = (uint32_t)h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        word_slot *s = &m->slot[i];
        if (!s->key_len || (s->hash == h && s->key_len == len && !memcmp(m->bytes + s->key_off, w, len)))
            return s;
    }
}

const int32_t *word_memo_get(const word_memo *m, const char *w, size_t len, int *n)
{
    if (!m->cap || !len)
        return NULL;
    const word_slot *s = word_find(m, w, len, word_hash(w, len));
    if (!s->key_len)
        return NULL;
    *n = (int)s->n_ids;
    return m->ids + s->ids_off;
}

void word_memo_clear(word_memo *m)
{
    if (m->slot)
        memset(m->slot, 0, m->cap * sizeof *m->slot);
    m->used = 0, m->n_bytes = 0, m->n_ids = 0;
}

/* Doubles the table (or makes the first), moving the words over. */
static int word_memo_grow(word_memo *m)
{
    uint32_t cap = m->cap ? 2 * m->cap : 1024;
    word_slot *old = m->slot, *s = calloc(cap, sizeof *s);
    if (!s)
        return -1;
    uint32_t old_cap = m->cap;
    m->slot = s, m->cap = cap;
    for (uint32_t i = 0; i < old_cap; i++)
        if (old[i].key_len)
            *word_find(m, m->bytes + old[i].key_off, old[i].key_len, old[i].hash) = old[i];
    free(old);
    return 0;
}

/* a with room for need elements of size bytes (*cap of them now), or NULL. */
static void *arena_room(void *a, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return a;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c *= 2;
    void *p = realloc(a, c * size);
    if (p)
        *cap = c;
    return p;
}

/* Notes w's ids.  Out of memory it notes nothing: the memo only saves work. */
void word_memo_put(word_memo *m, const char *w, size_t len, const int32_t *ids, int n)
{
    if (!len || len > WORD_LONGEST || n <= 0)
        return;
    if (m->used + 1 > WORDS_MAX || m->n_bytes + len > WORDS_BYTES)
        word_memo_clear(m);
    if ((m->used + 1) * 2 > m->cap && word_memo_grow(m))
        return;
    char *bytes = arena_room(m->bytes, &m->cap_bytes, m->n_bytes + len, 1);
    if (!bytes)
        return;
    m->bytes = bytes;
    int32_t *all = arena_room(m->ids, &m->cap_ids, m->n_ids + (size_t)n, sizeof *all);
    if (!all)
        return;
    m->ids = all;
    uint64_t h = word_hash(w, len);
    word_slot *s = word_find(m, w, len, h);
    if (s->key_len)
        return; /* already noted */
    memcpy(m->bytes + m->n_bytes, w, len);
    memcpy(m->ids + m->n_ids, ids, (size_t)n * sizeof *ids);
    *s = (word_slot){h, (uint32_t)m->n_bytes, (uint32_t)len, (uint32_t)m->n_ids, (uint32_t)n};
    m->n_bytes += len, m->n_ids += (size_t)n;
    m->used++;
}
