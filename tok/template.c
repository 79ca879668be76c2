/*
 * tok/template.c - chat templates.  Like llama.cpp's built-in list, we do
 * not run Jinja: the template text in the GGUF is recognised by the marks
 * it contains (llm_chat_detect_template's rules) and each family is
 * rendered by a small function that writes the exact bytes llama.cpp's
 * renderer writes.  A model without a template chats in raw mode: the
 * messages are concatenated, so a story model simply continues the text.
 */
#include "internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const NAMES[TMPL_COUNT] = {
    [TMPL_RAW] = "raw", [TMPL_CHATML] = "chatml", [TMPL_LLAMA2] = "llama2",
    [TMPL_LLAMA2_SYS] = "llama2-sys", [TMPL_LLAMA2_SYS_BOS] = "llama2-sys-bos",
    [TMPL_LLAMA2_SYS_STRIP] = "llama2-sys-strip", [TMPL_MISTRAL_V1] = "mistral-v1",
    [TMPL_MISTRAL_V3] = "mistral-v3", [TMPL_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [TMPL_MISTRAL_V7] = "mistral-v7", [TMPL_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
    [TMPL_PHI3] = "phi3", [TMPL_PHI4] = "phi4", [TMPL_FALCON3] = "falcon3", [TMPL_ZEPHYR] = "zephyr",
    [TMPL_MONARCH] = "monarch", [TMPL_GEMMA] = "gemma", [TMPL_ORION] = "orion",
    [TMPL_OPENCHAT] = "openchat", [TMPL_VICUNA] = "vicuna", [TMPL_VICUNA_ORCA] = "vicuna-orca",
    [TMPL_DEEPSEEK] = "deepseek", [TMPL_DEEPSEEK2] = "deepseek2", [TMPL_DEEPSEEK3] = "deepseek3",
    [TMPL_COMMAND_R] = "command-r", [TMPL_LLAMA3] = "llama3", [TMPL_CHATGLM3] = "chatglm3",
    [TMPL_CHATGLM4] = "chatglm4", [TMPL_GLMEDGE] = "glmedge", [TMPL_MINICPM] = "minicpm",
    [TMPL_EXAONE3] = "exaone3", [TMPL_GRANITE] = "granite", [TMPL_MEGREZ] = "megrez",
    [TMPL_LLAMA4] = "llama4",
};

const char *tmpl_name(int family) { return family >= 0 && family < TMPL_COUNT ? NAMES[family] : "?"; }

int tmpl_from_name(const char *name)
{
    for (int i = 0; i < TMPL_COUNT; i++)
        if (NAMES[i] && !strcmp(NAMES[i], name))
            return i;
    return -1;
}

void tmpl_list(char *buf, size_t size)
{
    size_t off = 0;
    buf[0] = 0;
    for (int i = 0; i < TMPL_COUNT && off < size; i++)
        off += (size_t)snprintf(buf + off, size - off, "%s%s", i ? ", " : "", NAMES[i]);
}

typedef struct text {
    const char *s;
    size_t n;
} text;

static int has(text t, const char *needle)
{
    return memmem(t.s, t.n, needle, strlen(needle)) != NULL;
}

static int detect_mistral_llama2(text t)
{
    if (has(t, "[SYSTEM_PROMPT]"))
        return TMPL_MISTRAL_V7;
    if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
        if (has(t, " [INST]"))
            return TMPL_MISTRAL_V1;
        if (has(t, "\"[INST]\""))
            return TMPL_MISTRAL_V3_TEKKEN;
        return TMPL_MISTRAL_V3;
    }
    if (has(t, "content.strip()"))
        return TMPL_LLAMA2_SYS_STRIP;
    if (has(t, "bos_token + '[INST]"))
        return TMPL_LLAMA2_SYS_BOS;
    return has(t, "<<SYS>>") ? TMPL_LLAMA2_SYS : TMPL_LLAMA2;
}

/* llama.cpp's detection rules, in its order: the first match wins. */
int tmpl_detect(const char *s, size_t n)
{
    text t = {s, n};
    char name[32];
    if (n < sizeof name) {
        memcpy(name, s, n);
        name[n] = 0;
        int f = tmpl_from_name(name);
        if (f >= 0)
            return f;
    }
    if (has(t, "<|im_start|>"))
        return has(t, "<|im_sep|>") ? TMPL_PHI4 : TMPL_CHATML;
    if ((n >= 7 && !memcmp(s, "mistral", 7)) || has(t, "[INST]"))
        return detect_mistral_llama2(t);
    if (has(t, "<|assistant|>") && has(t, "<|end|>"))
        return TMPL_PHI3;
    if (has(t, "[gMASK]<sop>"))
        return TMPL_CHATGLM4;
    if (has(t, "<|assistant|>") && has(t, "<|user|>"))
        return has(t, "</s>") ? TMPL_FALCON3 : TMPL_GLMEDGE;
    if (has(t, "<|user|>") && has(t, "<|endoftext|>"))
        return TMPL_ZEPHYR;
    if (has(t, "bos_token + message['role']"))
        return TMPL_MONARCH;
    if (has(t, "<start_of_turn>"))
        return TMPL_GEMMA;
    if (has(t, "'\\n\\nAssistant: ' + eos_token"))
        return TMPL_ORION;
    if (has(t, "GPT4 Correct "))
        return TMPL_OPENCHAT;
    if (has(t, "USER: ") && has(t, "ASSISTANT: "))
        return has(t, "SYSTEM: ") ? TMPL_VICUNA_ORCA : TMPL_VICUNA;
    if (has(t, "### Instruction:") && has(t, "<|EOT|>"))
        return TMPL_DEEPSEEK;
    if (has(t, "<|START_OF_TURN_TOKEN|>") && has(t, "<|USER_TOKEN|>"))
        return TMPL_COMMAND_R;
    if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>"))
        return TMPL_LLAMA3;
    if (has(t, "[gMASK]sop"))
        return TMPL_CHATGLM3;
    if (has(t, "<\xe7\x94\xa8\xe6\x88\xb7>")) /* <用户> */
        return TMPL_MINICPM;
    if (has(t, "'Assistant: ' + message['content'] + eos_token"))
        return TMPL_DEEPSEEK2;
    if (has(t, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>") && has(t, "<\xef\xbd\x9c" "User\xef\xbd\x9c>"))
        return TMPL_DEEPSEEK3;
    if (has(t, "[|system|]") && has(t, "[|assistant|]") && has(t, "[|endofturn|]"))
        return TMPL_EXAONE3;
    if (has(t, "<|start_of_role|>"))
        return TMPL_GRANITE;
    if (has(t, "<|role_start|>"))
        return TMPL_MEGREZ;
    if (has(t, "<|header_start|>") && has(t, "<|header_end|>"))
        return TMPL_LLAMA4;
    return -1;
}

/* ---- rendering ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* Writes s without leading and trailing whitespace. */
static void put_trim(sbuf *b, const char *s)
{
    size_t n = strlen(s), i = 0;
    while (i < n && isspace((unsigned char)s[i]))
        i++;
    while (n > i && isspace((unsigned char)s[n - 1]))
        n--;
    put(b, s + i, n - i);
}

static int is(const chat_msg *m, const char *role) { return !strcmp(m->role, role); }

static void render_llama2(sbuf *b, int f, const chat_msg *m, int n)
{
    int sys = f != TMPL_LLAMA2, bos = f == TMPL_LLAMA2_SYS_BOS, strip = f == TMPL_LLAMA2_SYS_STRIP;
    int inside = 1;
    puts_(b, "[INST] ");
    for (int i = 0; i < n; i++) {
        if (!inside) {
            inside = 1;
            puts_(b, bos ? "<s>[INST] " : "[INST] ");
        }
        void (*content)(sbuf *, const char *) = strip ? put_trim : puts_;
        if (is(&m[i], "system")) {
            puts_(b, sys ? "<<SYS>>\n" : "");
            content(b, m[i].content);
            puts_(b, sys ? "\n<</SYS>>\n\n" : "\n");
        } else if (is(&m[i], "user")) {
            content(b, m[i].content);
            puts_(b, " [/INST]");
        } else {
            content(b, m[i].content);
            puts_(b, "</s>");
            inside = 0;
        }
    }
}

static void render_mistral(sbuf *b, int f, const chat_msg *m, int n)
{
    if (f == TMPL_MISTRAL_V7 || f == TMPL_MISTRAL_V7_TEKKEN) {
        const char *sp = f == TMPL_MISTRAL_V7 ? " " : "";
        for (int i = 0; i < n; i++) {
            if (is(&m[i], "system"))
                puts_(b, "[SYSTEM_PROMPT]"), puts_(b, sp), puts_(b, m[i].content), puts_(b, "[/SYSTEM_PROMPT]");
            else if (is(&m[i], "user"))
                puts_(b, "[INST]"), puts_(b, sp), puts_(b, m[i].content), puts_(b, "[/INST]");
            else
                puts_(b, sp), puts_(b, m[i].content), puts_(b, "</s>");
        }
        return;
    }
    const char *lead = f == TMPL_MISTRAL_V1 ? " " : "", *trail = f == TMPL_MISTRAL_V3_TEKKEN ? "" : " ";
    int inside = 0;
    for (int i = 0; i < n; i++) {
        if (!inside) {
            puts_(b, lead), puts_(b, "[INST]"), puts_(b, trail);
            inside = 1;
        }
        if (is(&m[i], "system")) {
            puts_(b, m[i].content), puts_(b, "\n\n");
        } else if (is(&m[i], "user")) {
            puts_(b, m[i].content), puts_(b, lead), puts_(b, "[/INST]");
        } else {
            puts_(b, trail);
            if (f == TMPL_MISTRAL_V3)
                put_trim(b, m[i].content);
            else
                puts_(b, m[i].content);
            puts_(b, "</s>");
            inside = 0;
        }
    }
}

/* Families written as "<prefix role><sep>content<suffix>" per message. */
static void render_tagged(sbuf *b, const char *pre, const char *mid, const char *post,
                          const chat_msg *m, int n, int trim, const char *gen, int add_gen)
{
    for (int i = 0; i < n; i++) {
        puts_(b, pre), puts_(b, m[i].role), puts_(b, mid);
        (trim ? put_trim : puts_)(b, m[i].content);
        puts_(b, post);
    }
    if (add_gen)
        puts_(b, gen);
}

static void render_gemma(sbuf *b, const chat_msg *m, int n, int add_gen)
{
    sbuf sys = {0};
    for (int i = 0; i < n; i++) {
        if (is(&m[i], "system")) {
            put_trim(&sys, m[i].content);
            continue;
        }
        int model = is(&m[i], "assistant");
        puts_(b, "<start_of_turn>"), puts_(b, model ? "model" : m[i].role), puts_(b, "\n");
        if (sys.n && !model) {
            put(b, sys.p, sys.n), puts_(b, "\n\n");
            sys.n = 0;
        }
        put_trim(b, m[i].content);
        puts_(b, "<end_of_turn>\n");
    }
    free(sys.p);
    if (add_gen)
        puts_(b, "<start_of_turn>model\n");
}

/* system / user / assistant each with their own prefix and suffix. */
typedef struct roles3 {
    const char *sys_pre, *sys_post, *user_pre, *user_post, *asst_pre, *asst_post, *gen;
    int trim;
} roles3;

static void render_roles3(sbuf *b, const roles3 *r, const chat_msg *m, int n, int add_gen)
{
    for (int i = 0; i < n; i++) {
        const char *pre = r->asst_pre, *post = r->asst_post;
        if (is(&m[i], "system"))
            pre = r->sys_pre, post = r->sys_post;
        else if (is(&m[i], "user"))
            pre = r->user_pre, post = r->user_post;
        puts_(b, pre);
        (r->trim ? put_trim : puts_)(b, m[i].content);
        puts_(b, post);
    }
    if (add_gen)
        puts_(b, r->gen);
}

#define EOS3 "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"

static const roles3 ROLES3[TMPL_COUNT] = {
    [TMPL_VICUNA] = {"", "\n\n", "USER: ", "\n", "ASSISTANT: ", "</s>\n", "ASSISTANT:", 0},
    [TMPL_VICUNA_ORCA] = {"SYSTEM: ", "\n", "USER: ", "\n", "ASSISTANT: ", "</s>\n", "ASSISTANT:", 0},
    [TMPL_DEEPSEEK] = {"", "", "### Instruction:\n", "\n", "### Response:\n", "\n<|EOT|>\n",
                       "### Response:\n", 0},
    [TMPL_DEEPSEEK2] = {"", "\n\n", "User: ", "\n\n", "Assistant: ", EOS3, "Assistant:", 0},
    [TMPL_DEEPSEEK3] = {"", "\n\n", "<\xef\xbd\x9c" "User\xef\xbd\x9c>", "",
                        "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", EOS3,
                        "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", 0},
    [TMPL_COMMAND_R] = {"<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", 1},
    [TMPL_EXAONE3] = {"[|system|]", "[|endofturn|]\n", "[|user|]", "\n", "[|assistant|]",
                      "[|endofturn|]\n", "[|assistant|]", 1},
    [TMPL_MINICPM] = {"", "", "<\xe7\x94\xa8\xe6\x88\xb7>", "<AI>", "", "", "", 1},
};

static void render_other(sbuf *b, int f, const chat_msg *m, int n, int add_gen)
{
    switch (f) {
    case TMPL_CHATML:
        render_tagged(b, "<|im_start|>", "\n", "<|im_end|>\n", m, n, 0, "<|im_start|>assistant\n", add_gen);
        break;
    case TMPL_PHI3:
        render_tagged(b, "<|", "|>\n", "<|end|>\n", m, n, 0, "<|assistant|>\n", add_gen);
        break;
    case TMPL_PHI4:
        render_tagged(b, "<|im_start|>", "<|im_sep|>", "<|im_end|>", m, n, 0,
                      "<|im_start|>assistant<|im_sep|>", add_gen);
        break;
    case TMPL_FALCON3:
        render_tagged(b, "<|", "|>\n", "\n", m, n, 0, "<|assistant|>\n", add_gen);
        break;
    case TMPL_ZEPHYR:
        render_tagged(b, "<|", "|>\n", "<|endoftext|>\n", m, n, 0, "<|assistant|>\n", add_gen);
        break;
    case TMPL_LLAMA3:
        render_tagged(b, "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", m, n, 1,
                      "<|start_header_id|>assistant<|end_header_id|>\n\n", add_gen);
        break;
    case TMPL_LLAMA4:
        render_tagged(b, "<|header_start|>", "<|header_end|>\n\n", "<|eot|>", m, n, 1,
                      "<|header_start|>assistant<|header_end|>\n\n", add_gen);
        break;
    case TMPL_GRANITE:
        render_tagged(b, "<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>\n", m, n, 0,
                      "<|start_of_role|>assistant<|end_of_role|>\n", add_gen);
        break;
    case TMPL_MEGREZ:
        render_tagged(b, "<|role_start|>", "<|role_end|>", "<|turn_end|>", m, n, 0,
                      "<|role_start|>assistant<|role_end|>", add_gen);
        break;
    case TMPL_GLMEDGE:
        render_tagged(b, "<|", "|>\n", "", m, n, 0, "<|assistant|>", add_gen);
        break;
    case TMPL_CHATGLM4:
        puts_(b, "[gMASK]<sop>");
        render_tagged(b, "<|", "|>\n", "", m, n, 0, "<|assistant|>\n", add_gen);
        break;
    case TMPL_CHATGLM3:
        puts_(b, "[gMASK]sop");
        render_tagged(b, "<|", "|>\n ", "", m, n, 0, "<|assistant|>", add_gen);
        break;
    case TMPL_GEMMA:
        render_gemma(b, m, n, add_gen);
        break;
    default:
        render_roles3(b, &ROLES3[f], m, n, add_gen);
    }
}

static void render_special(sbuf *b, int f, const chat_msg *m, int n, int add_gen)
{
    if (f == TMPL_MONARCH) {
        for (int i = 0; i < n; i++) {
            puts_(b, i ? "<s>" : ""), puts_(b, m[i].role), puts_(b, "\n");
            puts_(b, m[i].content), puts_(b, "</s>\n");
        }
        if (add_gen)
            puts_(b, "<s>assistant\n");
    } else if (f == TMPL_ORION) {
        sbuf sys = {0};
        for (int i = 0; i < n; i++) {
            if (is(&m[i], "system")) {
                puts_(&sys, m[i].content);
            } else if (is(&m[i], "user")) {
                puts_(b, "Human: ");
                if (sys.n)
                    put(b, sys.p, sys.n), puts_(b, "\n\n"), sys.n = 0;
                puts_(b, m[i].content), puts_(b, "\n\nAssistant: </s>");
            } else {
                puts_(b, m[i].content), puts_(b, "</s>");
            }
        }
        free(sys.p);
    } else { /* openchat */
        for (int i = 0; i < n; i++) {
            if (!is(&m[i], "system")) {
                char role[32];
                snprintf(role, sizeof role, "%s", m[i].role);
                role[0] = (char)toupper((unsigned char)role[0]);
                puts_(b, "GPT4 Correct "), puts_(b, role), puts_(b, ": ");
            }
            puts_(b, m[i].content), puts_(b, "<|end_of_turn|>");
        }
        if (add_gen)
            puts_(b, "GPT4 Correct Assistant:");
    }
}

char *tmpl_render(int f, const chat_msg *m, int n, int add_gen, size_t *len)
{
    sbuf b = {0};
    puts_(&b, "");
    if (f == TMPL_RAW) {
        for (int i = 0; i < n; i++)
            puts_(&b, m[i].content);
    } else if (f >= TMPL_LLAMA2 && f <= TMPL_LLAMA2_SYS_STRIP) {
        render_llama2(&b, f, m, n);
    } else if (f >= TMPL_MISTRAL_V1 && f <= TMPL_MISTRAL_V7_TEKKEN) {
        render_mistral(&b, f, m, n);
    } else if (f == TMPL_MONARCH || f == TMPL_ORION || f == TMPL_OPENCHAT) {
        render_special(&b, f, m, n, add_gen);
    } else {
        render_other(&b, f, m, n, add_gen);
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.n;
    return b.p;
}

/* Texts that end an assistant turn when the model writes them as plain text. */
const char *const *tmpl_stops(int f)
{
    static const char *const none[] = {NULL};
    static const char *const stops[TMPL_COUNT][4] = {
        [TMPL_CHATML] = {"<|im_end|>", "<|im_start|>"},
        [TMPL_LLAMA2] = {"</s>", "[INST]"},
        [TMPL_LLAMA2_SYS] = {"</s>", "[INST]"},
        [TMPL_LLAMA2_SYS_BOS] = {"</s>", "[INST]"},
        [TMPL_LLAMA2_SYS_STRIP] = {"</s>", "[INST]"},
        [TMPL_MISTRAL_V1] = {"</s>", "[INST]"},
        [TMPL_MISTRAL_V3] = {"</s>", "[INST]"},
        [TMPL_MISTRAL_V3_TEKKEN] = {"</s>", "[INST]"},
        [TMPL_MISTRAL_V7] = {"</s>", "[INST]"},
        [TMPL_MISTRAL_V7_TEKKEN] = {"</s>", "[INST]"},
        [TMPL_PHI3] = {"<|end|>", "<|user|>"},
        [TMPL_PHI4] = {"<|im_end|>", "<|im_start|>"},
        [TMPL_FALCON3] = {"<|user|>", "<|endoftext|>"},
        [TMPL_ZEPHYR] = {"<|endoftext|>", "<|user|>"},
        [TMPL_MONARCH] = {"</s>"},
        [TMPL_GEMMA] = {"<end_of_turn>", "<start_of_turn>"},
        [TMPL_ORION] = {"</s>", "Human: "},
        [TMPL_OPENCHAT] = {"<|end_of_turn|>", "GPT4 Correct User:"},
        [TMPL_VICUNA] = {"</s>", "\nUSER:"},
        [TMPL_VICUNA_ORCA] = {"</s>", "\nUSER:"},
        [TMPL_DEEPSEEK] = {"<|EOT|>", "### Instruction:"},
        [TMPL_DEEPSEEK2] = {EOS3, "User:"},
        [TMPL_DEEPSEEK3] = {EOS3, "<\xef\xbd\x9c" "User\xef\xbd\x9c>"},
        [TMPL_COMMAND_R] = {"<|END_OF_TURN_TOKEN|>"},
        [TMPL_LLAMA3] = {"<|eot_id|>", "<|start_header_id|>"},
        [TMPL_CHATGLM3] = {"<|user|>", "<|observation|>"},
        [TMPL_CHATGLM4] = {"<|user|>", "<|observation|>"},
        [TMPL_GLMEDGE] = {"<|user|>"},
        [TMPL_MINICPM] = {"<\xe7\x94\xa8\xe6\x88\xb7>"},
        [TMPL_EXAONE3] = {"[|endofturn|]"},
        [TMPL_GRANITE] = {"<|end_of_text|>", "<|start_of_role|>"},
        [TMPL_MEGREZ] = {"<|turn_end|>"},
        [TMPL_LLAMA4] = {"<|eot|>", "<|header_start|>"},
    };
    return f > TMPL_RAW && f < TMPL_COUNT ? stops[f] : none;
}
