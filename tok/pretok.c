/*
 * tok/pretok.c - byte-level BPE pre-tokenization.  tokenizer.ggml.pre names
 * a list of regexes (llama.cpp's table); they are applied one after another,
 * each splitting every piece left by the previous one into its matches and
 * the text between them.  PCRE2 compiled with UTF and Unicode properties
 * does the matching.  Also here: the UTF-8 helpers and GPT-2's byte <->
 * code point mapping that byte-level vocabularies are written in.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "internal.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 ---- */

/* Decodes one code point at s[*i], as llama.cpp does: an invalid sequence
 * consumes one byte and yields U+FFFD. */
uint32_t tok_utf8_next(const char *s, size_t len, size_t *i)
{
    const uint8_t *p = (const uint8_t *)s + *i;
    size_t left = len - *i;
    uint32_t c = p[0];
    int n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 1) {
        *i += 1;
        return c;
    }
    if (n == 0 || (size_t)n > left)
        goto bad;
    c &= 0x7f >> n;
    for (int k = 1; k < n; k++) {
        if ((p[k] & 0xc0) != 0x80)
            goto bad;
        c = (c << 6) | (p[k] & 0x3f);
    }
    *i += (size_t)n;
    return c;
bad:
    *i += 1;
    return 0xfffd;
}

size_t tok_utf8_put(uint32_t c, char *out)
{
    uint8_t *o = (uint8_t *)out;
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xc0 | (c >> 6));
        o[1] = (uint8_t)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xe0 | (c >> 12));
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
        o[2] = (uint8_t)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (uint8_t)(0xf0 | (c >> 18));
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
    o[3] = (uint8_t)(0x80 | (c & 0x3f));
    return 4;
}

/* Valid UTF-8 is the shortest encoding of a scalar value (no overlongs, no
 * surrogates, nothing above U+10FFFF). */
size_t tok_utf8_valid_prefix(const char *s, size_t len)
{
    static const uint32_t min_of_len[5] = {0, 0, 0x80, 0x800, 0x10000};
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        uint32_t c = tok_utf8_next(s, len, &j);
        if (c == 0xfffd && !(j - i == 3 && !memcmp(s + i, "\xef\xbf\xbd", 3)))
            return i;
        if ((c >= 0xd800 && c <= 0xdfff) || c > 0x10ffff || c < min_of_len[j - i])
            return i;
        i = j;
    }
    return len;
}

/* ---- GPT-2 bytes ---- */

static int byte_printable(int b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

/* Printable bytes map to themselves; the others to 256, 257, ... in order. */
static uint32_t byte_cpt(uint8_t b)
{
    if (byte_printable(b))
        return b;
    uint32_t n = 0;
    for (int x = 0; x < b; x++)
        n += !byte_printable(x);
    return 256 + n;
}

size_t tok_byte_to_utf8(uint8_t byte, char out[4]) { return tok_utf8_put(byte_cpt(byte), out); }

/*
 * byte_cpt's inverse.  The bytes byte_printable leaves out are 0x00-0x20,
 * 0x7f-0xa0 and 0xad, so code points 256.. 323 name them in that order;
 * computed, not searched: every byte-level token's text goes through here
 * when a vocabulary loads (151k tokens for Qwen).
 */
int tok_cpt_to_byte(uint32_t cpt)
{
    if (cpt < 256)
        return byte_printable((int)cpt) ? (int)cpt : -1;
    const uint32_t k = cpt - 256;
    if (k <= 0x20)
        return (int)k;
    if (k <= 0x20 + 0x22)
        return (int)(0x7f + k - 0x21);
    return k == 0x43 ? 0xad : -1;
}

/* ---- the pre-tokenizer table ---- */

#define CONTRACTIONS_CI "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define LLAMA3_RE CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_RE CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define CJK_RE "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"

typedef struct pre_def {
    const char *names;        /* '|'-separated tokenizer.ggml.pre values */
    const char *canon;
    const char *re[PRE_MAX_REGEX];
} pre_def;

static const pre_def PRE[] = {
    {"default", "default",
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2_RE, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"llama3|llama-v3|llama-bpe|falcon3|pixtral|dbrx|smaug-bpe", "llama3", {LLAMA3_RE}},
    {"deepseek-llm", "deepseek-llm",
     {"[\r\n]",
      "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
      "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
      "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
      "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
      "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
      "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
      "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
      "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
      "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
      "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
      "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
      "\U0001e900-\U0001e943]+",
      "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", "\\s+$", CJK_RE,
      "\\p{N}+"}},
    {"deepseek-coder", "deepseek-coder",
     {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", CJK_RE, "\\p{N}"}},
    {"deepseek-v3", "deepseek-v3",
     {"\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
    {"falcon", "falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2_RE, "[0-9][0-9][0-9]"}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b", "starcoder",
     {"\\p{N}", GPT2_RE}},
    {"gpt-2|phi-2|mpt|gpt-neox|olmo|jais|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|exaone4|jina-v1-en|jina-v2-code|roberta-bpe",
     "gpt-2", {GPT2_RE}},
    {"qwen2|stablelm2|deepseek-r1-qwen|megrez|hunyuan", "qwen2", {QWEN2_RE}},
    {"chatglm-bpe|glm4", "chatglm4", {LLAMA3_RE}},
    {"poro-chat|bloom|gpt3-finnish", "bloom", {" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"}},
    {"viking", "viking", {" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", "\\p{N}"}},
    {"tekken", "tekken",
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"gpt-4o|llama4", "gpt-4o",
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" CONTRACTIONS_CI "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" CONTRACTIONS_CI "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
};

static int name_in(const char *names, const char *s, size_t len)
{
    for (const char *p = names; *p;) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && !memcmp(p, s, len))
            return 1;
        p += n + (bar != NULL);
    }
    return 0;
}

int pretok_init(pretok *p, const char *name, size_t len, lm_err *e)
{
    memset(p, 0, sizeof *p);
    const pre_def *d = NULL;
    if (len == 0)
        d = &PRE[0];
    for (size_t i = 0; !d && i < sizeof PRE / sizeof PRE[0]; i++)
        if (name_in(PRE[i].names, name, len))
            d = &PRE[i];
    if (!d) {
        lm_seterr(e, "unknown pre-tokenizer type '%.*s'", (int)(len > 40 ? 40 : len), name);
        return -1;
    }
    p->name = d->canon;
    for (int i = 0; i < PRE_MAX_REGEX && d->re[i]; i++) {
        int err;
        PCRE2_SIZE off;
        uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_NO_UTF_CHECK;
        p->re[i] = pcre2_compile((PCRE2_SPTR)d->re[i], PCRE2_ZERO_TERMINATED, opts, &err, &off, NULL);
        if (!p->re[i]) {
            lm_seterr(e, "pre-tokenizer '%s': regex %d does not compile at %zu", d->canon, i,
                      (size_t)off);
            pretok_free(p);
            return -1;
        }
        pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE); /* best effort */
        p->n_regex = i + 1;
    }
    return 0;
}

void pretok_free(pretok *p)
{
    for (int i = 0; i < p->n_regex; i++)
        pcre2_code_free(p->re[i]);
    p->n_regex = 0;
}

typedef struct spans {
    size_t *start, *len;
    int n, cap;
} spans;

static int span_push(spans *s, size_t start, size_t len)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        size_t *a = realloc(s->start, (size_t)cap * sizeof *a);
        if (!a)
            return -1;
        s->start = a;
        size_t *b = realloc(s->len, (size_t)cap * sizeof *b);
        if (!b)
            return -1;
        s->len = b;
        s->cap = cap;
    }
    s->start[s->n] = start;
    s->len[s->n++] = len;
    return 0;
}

/* Splits text[start, start+len) by one regex into matches and gaps. */
static int split_one(pcre2_code *re, pcre2_match_data *md, const char *text, size_t start,
                     size_t len, spans *out)
{
    size_t at = 0;
    while (at < len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)(text + start), len, at, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0)
            break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step one character */
            size_t next = ms + 1;
            while (next < len && ((uint8_t)text[start + next] & 0xc0) == 0x80)
                next++;
            if (ms > at && span_push(out, start + at, ms - at))
                return -1;
            if (span_push(out, start + ms, next - ms))
                return -1;
            at = next;
            continue;
        }
        if (ms > at && span_push(out, start + at, ms - at))
            return -1;
        if (span_push(out, start + ms, me - ms))
            return -1;
        at = me;
    }
    if (at < len && span_push(out, start + at, len - at))
        return -1;
    return 0;
}

int pretok_split(const pretok *p, const char *text, size_t len, size_t **starts, size_t **lens,
                 int *n)
{
    spans cur = {0}, next = {0};
    if (span_push(&cur, 0, len))
        goto oom;
    for (int r = 0; r < p->n_regex; r++) {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re[r], NULL);
        if (!md)
            goto oom;
        next.n = 0;
        for (int i = 0; i < cur.n; i++)
            if (split_one(p->re[r], md, text, cur.start[i], cur.len[i], &next)) {
                pcre2_match_data_free(md);
                goto oom;
            }
        pcre2_match_data_free(md);
        spans t = cur;
        cur = next;
        next = t;
    }
    free(next.start);
    free(next.len);
    *starts = cur.start;
    *lens = cur.len;
    *n = cur.n;
    return 0;
oom:
    free(cur.start);
    free(cur.len);
    free(next.start);
    free(next.len);
    return -1;
}
