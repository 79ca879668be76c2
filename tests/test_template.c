/*
 * tests/test_template.c - chat templates against llama.cpp: the renderings
 * its tests/test-chat-template.cpp expects for its fixed conversation, the
 * family its detection picks for real template texts, and the families of
 * the templates in ../shared/vocab.
 */
#include "util.h"

#include <stdlib.h>
#include <string.h>

static const chat_msg CONV[] = {
    {"system", "You are a helpful assistant"}, {"user", "Hello"}, {"assistant", "Hi there"},
    {"user", "Who are you"}, {"assistant", "   I am an assistant   "}, {"user", "Another question"},
};

typedef struct expect {
    const char *family;
    const char *text;
} expect;

/* llama.cpp's expected_output for each template family it renders built in. */
static const expect RENDERINGS[] = {
    {"chatml", "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n"},
    {"llama2", "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   </s>[INST] Another question [/INST]"},
    {"llama2-sys-bos", "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who are you [/INST]   I am an assistant   </s><s>[INST] Another question [/INST]"},
    {"llama2-sys-strip", "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]I am an assistant</s>[INST] Another question [/INST]"},
    {"monarch", "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi there</s>\n<s>user\nWho are you</s>\n<s>assistant\n   I am an assistant   </s>\n<s>user\nAnother question</s>\n<s>assistant\n"},
    {"gemma", "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n"},
    {"orion", "Human: You are a helpful assistant\n\nHello\n\nAssistant: </s>Hi there</s>Human: Who are you\n\nAssistant: </s>   I am an assistant   </s>Human: Another question\n\nAssistant: </s>"},
    {"openchat", "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>GPT4 Correct Assistant: Hi there<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 Correct Assistant:    I am an assistant   <|end_of_turn|>GPT4 Correct User: Another question<|end_of_turn|>GPT4 Correct Assistant:"},
    {"deepseek", "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n### Instruction:\nWho are you\n### Response:\n   I am an assistant   \n<|EOT|>\n### Instruction:\nAnother question\n### Response:\n"},
    {"vicuna", "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:"},
    {"vicuna-orca", "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:"},
    {"command-r", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    {"llama3", "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"phi3", "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n"},
    {"chatglm3", "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>\n Hi there<|user|>\n Who are you<|assistant|>\n    I am an assistant   <|user|>\n Another question<|assistant|>"},
    {"chatglm4", "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>\n"},
    {"glmedge", "<|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>"},
    {"minicpm", "You are a helpful assistant<\xe7\x94\xa8\xe6\x88\xb7>Hello<AI>Hi there<\xe7\x94\xa8\xe6\x88\xb7>Who are you<AI>I am an assistant<\xe7\x94\xa8\xe6\x88\xb7>Another question<AI>"},
    {"deepseek2", "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>User: Who are you\n\nAssistant:    I am an assistant   <\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>User: Another question\n\nAssistant:"},
    {"granite", "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   I am an assistant   <|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>\n"},
    {"mistral-v1", " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   </s> [INST] Another question [/INST]"},
    {"mistral-v3", "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>[INST] Another question[/INST]"},
    {"mistral-v3-tekken", "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]"},
    {"mistral-v7", "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]"},
    {"zephyr", "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n<|assistant|>\nHi there<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n<|assistant|>\n   I am an assistant   <|endoftext|>\n<|user|>\nAnother question<|endoftext|>\n<|assistant|>\n"},
    {"deepseek3", "You are a helpful assistant\n\n<\xef\xbd\x9cUser\xef\xbd\x9c>Hello<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>Hi there<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>Who are you<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>   I am an assistant   <\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>Another question<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"},
};

START_TEST(test_renderings)
{
    for (size_t i = 0; i < sizeof RENDERINGS / sizeof RENDERINGS[0]; i++) {
        int f = tmpl_from_name(RENDERINGS[i].family);
        ck_assert_msg(f >= 0, "no family %s", RENDERINGS[i].family);
        size_t len;
        char *got = tmpl_render(f, CONV, 6, 1, &len);
        ck_assert_msg(got && !strcmp(got, RENDERINGS[i].text), "%s:\n got [%s]\nwant [%s]",
                      RENDERINGS[i].family, got, RENDERINGS[i].text);
        ck_assert_int_eq((int)len, (int)strlen(RENDERINGS[i].text));
        free(got);
    }
}
END_TEST

/* Template texts (abridged from real models) and the family llama.cpp picks. */
static const expect DETECT[] = {
    {"chatml", "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"},
    {"llama2", "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}{% endfor %}"},
    {"llama2-sys-bos", "{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}{{- '[INST] <<SYS>>\\n' + messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}"},
    {"llama2-sys-strip", "{{ '[INST] ' + content.strip() + ' [/INST]' }}{{ '<<SYS>>\\n' }}"},
    {"gemma", "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"},
    {"llama3", "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}"},
    {"phi3", "{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}"},
    {"zephyr", "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + eos_token }}{% endif %}{% endfor %}<|endoftext|>"},
    {"command-r", "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>' }}"},
    {"deepseek", "{{'### Instruction:\\n' + message['content'] + '\\n'}}{{'### Response:\\n' + message['content'] + '\\n<|EOT|>\\n'}}"},
    {"vicuna", "{{-'USER: ' + message['content'] + '\\n'-}}{{-'ASSISTANT: ' + message['content'] + '</s>\\n' -}}"},
    {"mistral-v7", "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{{- '[INST]' + message['content'] + '[/INST]' }}"},
    {"deepseek3", "{{'<\xef\xbd\x9cUser\xef\xbd\x9c>' + message['content']}}{{'<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>' + content + '<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>'}}"},
    {"monarch", "{% for message in messages %}{{bos_token + message['role'] + '\\n' + message['content'] + eos_token + '\\n'}}{% endfor %}"},
    {"chatml", "chatml"},
};

START_TEST(test_detection)
{
    for (size_t i = 0; i < sizeof DETECT / sizeof DETECT[0]; i++) {
        int f = tmpl_detect(DETECT[i].text, strlen(DETECT[i].text));
        ck_assert_msg(f == tmpl_from_name(DETECT[i].family), "expected %s, got %s for %s",
                      DETECT[i].family, f >= 0 ? tmpl_name(f) : "none", DETECT[i].text);
    }
    ck_assert_int_eq(tmpl_detect("{{ messages }}", 14), -1);
}
END_TEST

static int vocab_family(const char *rel)
{
    char *p = shared_path(rel);
    gguf_file g;
    lm_err e;
    ck_assert_msg(gguf_open(&g, p, &e) == 0, "%s", e.msg);
    const char *t;
    size_t len;
    ck_assert_int_eq(gguf_get_str(&g, "tokenizer.chat_template", &t, &len, &e), 1);
    int f = tmpl_detect(t, len);
    gguf_close(&g);
    free(p);
    return f;
}

START_TEST(test_real_vocab_templates)
{
    ck_assert_str_eq(tmpl_name(vocab_family("vocab/ggml-vocab-qwen2.gguf")), "chatml");
    ck_assert_str_eq(tmpl_name(vocab_family("vocab/ggml-vocab-gemma3.gguf")), "gemma");
    ck_assert_str_eq(tmpl_name(vocab_family("vocab/ggml-vocab-llama3.gguf")), "llama3");
}
END_TEST

START_TEST(test_raw_and_no_gen_prompt)
{
    chat_msg m[] = {{"user", "Once upon a time"}, {"assistant", ", there was"}, {"user", " a cat"}};
    size_t len;
    char *s = tmpl_render(TMPL_RAW, m, 3, 1, &len);
    ck_assert_str_eq(s, "Once upon a time, there was a cat");
    free(s);
    s = tmpl_render(TMPL_CHATML, m, 1, 0, &len);
    ck_assert_str_eq(s, "<|im_start|>user\nOnce upon a time<|im_end|>\n");
    free(s);
}
END_TEST

TCase *tcase_template(void)
{
    TCase *tc = tcase_create("template");
    tcase_add_test(tc, test_renderings);
    tcase_add_test(tc, test_detection);
    tcase_add_test(tc, test_real_vocab_templates);
    tcase_add_test(tc, test_raw_and_no_gen_prompt);
    return tc;
}
