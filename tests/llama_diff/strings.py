#!/usr/bin/env python3
"""strings.py SEED N: N random test strings in llama.cpp's vocab test format (tests/llama_diff).

Words, contractions, runs of spaces, tabs and newlines, numbers, punctuation, accented
Latin and other scripts, emoji with joiners and modifiers, combining marks, zero-width
and full-width characters, control-token text, random code points.  "</s>" is left out:
llama.cpp after c392e5094 (this project's reference) reads it as a control token in
every vocabulary, as an end of generation, where c392e5094 reads a user-defined "</s>"
(Phi-3's, Gemma 3's) as that token even without parse_special."""
import random, sys

seed, n = int(sys.argv[1]), int(sys.argv[2])
R = random.Random(seed)
WORDS = ("the of and to in is you that it he was for on are as with his they I at be this have from "
         "or one had by word but not what all were we when your can said there use an each which she do "
         "how their if will up other about out many then them these so some her would make like him into "
         "time has look two more write go see number no way could people my than first water been call "
         "who oil its now find long down day did get come made may part").split()
PIECES = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "n't", " ", "  ", "   ", "\t", "\n",
          "\n\n", "\r\n", " \n", "\t\t", " \t ", "0", "1", "12", "123", "1234", "12345", "3.14", "1,000",
          "-5", "+7", "1e10", "0x1F", "2024-11-29", "!", "?", ".", "...", ",", ";", ":", "-", "--", "—",
          "–", "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "|", "@", "#", "$", "%", "^", "&", "*",
          "_", "=", "+", "~", "`", "\"", "'", "é", "ü", "ñ", "ç", "ß", "Æ", "ø", "å", "Ω", "π", "λ",
          "Привет", "мир", "日本語", "中文", "한국어", "こんにちは", "العربية", "עברית", "हिन्दी", "ไทย",
          "Ελληνικά", "😀", "🚀", "👍🏽", "👨‍👩‍👧", "❤️", "🇺🇸", "e\u0301", "a\u0308", "\u200b", "\u200d",
          "\u00a0", "\u3000", "\ufeff", "ﬁ", "Ⅻ", "①", "²", "½", "ǅ", "İ", "ı", "<s>", "<|im_start|>",
          "<|endoftext|>", "<unk>", "[INST]", "<|user|>", "<start_of_turn>", "▁", "Ġ", "Ċ",
          "http://example.com/a?b=c", "foo_bar", "camelCase", "ALLCAPS", "MiXeD", "snake_case_name",
          "x=y+z*2;", "def f(x):\n    return x", "printf(\"%d\\n\", i);", "\x7f", "\x01", "\x1b[0m",
          "🀄", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ｆｕｌｌ", "ｶﾀｶﾅ"]
RANGES = [(0x20, 0x7e), (0xa0, 0x2fff), (0x3000, 0x9fff), (0xac00, 0xd7a3), (0x1f300, 0x1faff), (0x10000, 0x10ffff)]


def word():
    w = R.choice(WORDS)
    r = R.random()
    return w.capitalize() if r < 0.2 else w.upper() if r < 0.25 else w


def code_points():
    return "".join(chr(R.randint(*R.choice(RANGES))) for _ in range(R.randint(1, 4)))


def one():
    parts = []
    for _ in range(R.randint(0, 14)):
        r = R.random()
        parts.append(word() if r < 0.45 else R.choice(PIECES) if r < 0.9 else code_points())
        if R.random() < 0.6:
            parts.append(R.choice([" ", " ", "", "\n", "  "]))
    return "".join(c for c in "".join(parts) if not 0xD800 <= ord(c) <= 0xDFFF)


sys.stdout.buffer.write("".join(one() + "\n__ggml_vocab_test__\n" for _ in range(n)).encode("utf-8"))
