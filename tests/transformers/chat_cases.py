#!/usr/bin/env python3
"""Random conversations rendered by Hugging Face transformers' apply_chat_template (Jinja2 running the Qwen2.5
template of ../shared/fixtures/tokenizer/qwen2.5) and tokenized by it, for tests/transformers/chat_test.cpp to compare
with qwen::render_chat, our Jinja subset and our tokenizer. Not a test by itself: it only writes what transformers did.

  chat_cases.py OUT_DIR [--count N] [--seed S]   writes OUT_DIR/chat_cases.json and prints its facts as one JSON line

Run in the Debian sid root (scripts/libtorch2.sh sid python tests/transformers/chat_cases.py /src/build/refs), which
sets DAPO_SHARED_DIR; the same seed and count give the same conversations.
"""
import argparse
import json
import os
import random
import sys
import time
import unicodedata

import jinja2
import tokenizers
import transformers
from transformers import AutoTokenizer

from tokenizer_cases import load_gsm8k, random_code_point  # one place for what random characters may be

ROLES = ("system", "user", "assistant")  # render_chat refuses any other role by design

# Pieces that content is built from: what could trip a renderer that evaluates content, trims it or escapes it, and
# what could trip a tokenizer (special-token text and its fragments, whitespace runs, normalisation, rare scripts).
JINJA = [
    "{{ x }}", "{{x}}", "{% if %}", "{% if true %}yes{% endif %}", "{#", "#}", "{# comment #}", "}}", "%}", "{{'",
    "{{", "{%", "{%-", "-%}", "{{-", "-}}", "{%+", "{{ messages[0]['content'] }}", "{% raw %}", "{% endraw %}",
    "{{ '<|im_start|>' + message.role }}", "{%- for message in messages %}{{ message }}{%- endfor %}",
    "{{ raise_exception('no') }}", "{% set x = 1 %}", "{{ add_generation_prompt }}", "{ {", "} }", "{{{", "}}}",
]
SPECIAL = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>assistant\n", "<|im_start|>system\n",
    "<|im_end|>\n", "<|im_", "im_start|>", "_end|>", "<|", "|>", "<|endoftext|", "|endoftext|>", "< |im_end| >",
    "<|IM_END|>", "<<|im_end|>>", "<|im_end|><|im_start|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|vision_pad|>", "<|file_sep|>", "system", "assistant\n", "user\n", "\nassistant", "System", "ASSISTANT",
    "<think>\n", "</think>\n", "<answer>\n", "</answer>\n", "<answer>72</answer>",
]
PUNCTUATION = [
    "'", '"', "\\", "\\n", "\\\\", "\\'", '\\"', "''", '""', "`", "```python\nprint('hi')\n```", "#### 72",
    "<<48/2=24>>", "$", "$$x^2$$", "\\frac{1}{2}", "&amp;", "<b>", "</b>", "->", "=>", "...", "!?", "%", "%%", "#", "~",
    "|", "||",
]
WHITESPACE = [
    " ", "  ", "   ", "\n", "\n\n", "\n\n\n", "\n \n", " \n", "\n ", "\t", "\t\n", "\r\n", "\r", "\r\r\n", "\u00a0",
    "\u3000", "\u2028", "\u2029", "\u0085", "\u000b", "\u000c", "\u001c", "\u200b", "\ufeff", "\u2003", " \t \n",
    "\u180e", " \u180e", "\u180e ",
]
UNICODE = [
    "按照如下格式", "你好，世界！", "数学题：3个苹果", "こんにちは", "カタカナ", "한국어", "안녕하세요", "Привет, мир",
    "Ελληνικά", "مرحبا بالعالم", "שלום", "हिन्दी", "ภาษาไทย", "Tiếng Việt", "👍", "👍🏽", "👨‍👩‍👧", "🇫🇷", "😀😀😀",
    "🤖", "e\u0301", "A\u030a", "\u212b", "\u1100\u1161\u11a8", "o\u0308\u0304", "ﬁ", "Ⅻ", "①②③", "½", "x²",
    "\u0301", "\u00e9", "Ã©", "\ufffd", "\U0001d400", "\u0000", "\u0001", "\u007f", "\u00ad", "\ue000", "\U0010ffff",
]
WORDS = [
    "Hello", "hello world", "don't", "I'M", "they'LL", "we've", "It's", "Answer:", "The answer is 72.", "12345678",
    "3.14159", "1,000", "-7", "0.5", "A", "a", "x", "OK", "step 1", "Let's think step by step.", "Natalia",
    "What is 2 + 2?", "Yes.", "No", "True", "None", "null", "[]", "{}", "{'role': 'user'}", '{"a": 1}',
]
# What only the tokenizer's pre-tokenizer regex and normaliser see: case-insensitive contractions under Unicode case
# folding (the long s folds to s), digits and letters of other scripts (\p{N}, \p{L}), marks NFC reorders or composes.
TOKENIZER = [
    "'s", "'S", "'LL", "'Ve", "'rE", "'M", "'D", "'T", "'ſ", "'ſt", "'ﬅ", "'ﬆ", "'\u212a", "ſ", "İ", "ı", "ß", "ẞ",
    "ﬀ", "١٢٣", "०१२", "𝟙𝟚", "²³", "⅓", "〇", "ไม่", "क्षि", "\u0345", "\u0300a", "a\u0300\u0316", "\u0e33",
    "\u1e9b\u0323", "\u0958", "\u2126", "\u1f80", "\uac00\u11a8", "\u1100\u1161", "\u0f73", "\u0344",
]
KINDS = (JINJA, SPECIAL, PUNCTUATION, WHITESPACE, UNICODE, WORDS, TOKENIZER)


def random_text(rng):
    """A few random characters (tokenizer_cases.random_code_point: any assigned in Unicode 16.0), or a run of ASCII
    (printable and whitespace) with no structure at all."""
    if rng.random() < 0.5:
        return "".join(random_code_point(rng) for _ in range(rng.randint(1, 6)))
    return "".join(rng.choice("ab Z9'\"\\{}%#<|>_\t\n\r\x0b\x0c  .,!-") for _ in range(rng.randint(1, 24)))


def content(rng, gsm8k):
    """One message's content: empty, a GSM8K text, or pieces of every kind, sometimes padded with whitespace."""
    roll = rng.random()
    if roll < 0.08:
        return ""
    if roll < 0.25 and gsm8k:
        text = rng.choice(gsm8k)
        if rng.random() < 0.3:  # an answer in the driver's format, or a question with a piece spliced in
            text = rng.choice(["<think>\n", ""]) + text + rng.choice(["\n</think>\n<answer>\n72\n</answer>\n", ""])
        if rng.random() < 0.3:
            at = rng.randrange(len(text) + 1)
            text = text[:at] + rng.choice(rng.choice(KINDS)) + text[at:]
        return text
    pieces = []
    for _ in range(rng.randint(1, 8)):
        pieces.append(random_text(rng) if rng.random() < 0.15 else rng.choice(rng.choice(KINDS)))
        if rng.random() < 0.3:
            pieces.append(rng.choice(["", " ", "\n"]))
    text = "".join(pieces)
    if rng.random() < 0.2:
        text = rng.choice(WHITESPACE) + text
    if rng.random() < 0.2:
        text = text + rng.choice(WHITESPACE)
    return text


def roles(rng):
    """The roles of one conversation (1 to 8 messages): alternating or not, with and without a first system message,
    sometimes a later one, ending with either side."""
    count = rng.randint(1, 8)
    shape = rng.random()
    if shape < 0.5:  # the usual: [system,] user, assistant, user, ...
        first = ["system"] if rng.random() < 0.6 else []
        turns = ["user" if i % 2 == 0 else "assistant" for i in range(count - len(first))]
        result = first + turns
        if not result:
            result = ["system"]
        if rng.random() < 0.15:  # a system message later in the conversation
            result.insert(rng.randint(1, len(result)), "system")
    elif shape < 0.6:  # assistant first
        result = ["assistant" if i % 2 == 0 else "user" for i in range(count)]
    else:  # any order
        result = [rng.choice(ROLES) for _ in range(count)]
    return result[:8]


def conversation(rng, gsm8k):
    messages = [{"role": role, "content": content(rng, gsm8k)} for role in roles(rng)]
    return messages, rng.random() < 0.5


def write(out_dir, seed, count):
    """Renders `count` conversations drawn with random.Random(seed); writes out_dir/chat_cases.json; returns facts."""
    start = time.monotonic()
    shared = os.environ.get("DAPO_SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared"))
    tokenizer_dir = os.path.join(shared, "fixtures", "tokenizer", "qwen2.5")
    if not os.path.isdir(tokenizer_dir):
        raise SystemExit(f"chat_cases: {tokenizer_dir} not found (set DAPO_SHARED_DIR to the shared/ directory)")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    gsm8k = load_gsm8k(shared, lines_read=300)  # the driver's prompts and replies
    normalizer = tokenizer.backend_tokenizer.normalizer
    rng = random.Random(seed)
    cases, newer_marks = [], 0
    while len(cases) < count:
        messages, add_generation_prompt = conversation(rng, gsm8k)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        # tokenizers' NFC has Unicode 9.0 tables (unicode-normalization-alignments): marks assigned later are starters
        # to it and are not reordered (U+1DF6 U+035A stays; Unicode's NFC gives U+035A U+1DF6), and later compositions
        # (U+11935 U+11930 -> U+11938) are not made. Ours follows Unicode (utf8proc), so conversations whose NFC by
        # tokenizers differs from Python's are left out (tests/fixtures/chat_regressions.json shows one).
        if normalizer.normalize_str(text) != unicodedata.normalize("NFC", text):
            newer_marks += 1
            continue
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # transformers 5: a BatchEncoding; 4: a list
        cases.append({"messages": messages, "add_generation_prompt": add_generation_prompt, "text": text,
                      "ids": list(ids)})
    os.makedirs(out_dir, exist_ok=True)
    result = {"seed": seed, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
              "jinja2": jinja2.__version__, "count": len(cases), "cases": cases}
    with open(os.path.join(out_dir, "chat_cases.json"), "w", encoding="utf-8") as out:
        json.dump(result, out, ensure_ascii=False)
    facts = {key: value for key, value in result.items() if key != "cases"}
    facts["unicodedata"] = unicodedata.unidata_version  # what "assigned" means to random_code_point
    facts["gsm8k_texts"] = len(gsm8k)
    facts["left_out_for_tokenizers_nfc"] = newer_marks
    facts["seconds"] = round(time.monotonic() - start, 2)
    return facts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.count < 1:
        parser.error("--count must be at least 1")
    print(json.dumps(write(args.out_dir, args.seed, args.count)))


if __name__ == "__main__":
    sys.exit(main())
