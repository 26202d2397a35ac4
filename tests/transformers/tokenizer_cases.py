#!/usr/bin/env python3
"""Random strings and id sequences run through Hugging Face tokenizers (the Rust library) loading the Qwen2.5
tokenizer.json of ../shared, for tests/transformers/tokenizer_test.cpp to compare with qwen::Tokenizer. Not a test by
itself: it only writes what tokenizers did.

  tokenizer_cases.py OUT_DIR [--count N] [--seed S]   writes OUT_DIR/tokenizer_cases.json, prints its facts as one
                                                      JSON line

Run in the Debian sid root (scripts/libtorch2.sh sid python tests/transformers/tokenizer_cases.py /src/build/refs),
which sets DAPO_SHARED_DIR; the same seed and count give the same strings.
"""
import argparse
import json
import os
import random
import sys
import time
import unicodedata

import tokenizers

# ---- pieces that strings are built from

LATIN = ["the", "The", "apples", "Natalia", "sold", "clips", "HELLO", "mIxEd", "x", "a", "I", "zz", "Straße", "naïve"]
ACCENTED = ["café", "résumé", "Ångström", "façade", "jalapeño", "Øresund", "Łódź", "Škoda", "İstanbul", "ğüşıöç",
            "Tiếng Việt", "Nguyễn", "Œuvre", "æble", "ÿ", "ǅ", "ǈungla"]
GREEK = ["Ελληνικά", "αβγ", "Σίσυφος", "ΣΊΣΥΦΟΣ", "ἀρχή", "ᾯ", "πολύ", "ς", "Ω", "ΐ"]
CYRILLIC = ["Привет", "мир", "ЁЖИК", "съёмка", "Україна", "ђ", "Ӂ", "щи"]
CJK = ["你好", "世界", "按照如下格式", "数学题", "个", "苹果", "，", "。", "！", "（", "）", "「", "」", "㐀", "𠀀", "𪜀", "龘", "々"]
KANA = ["こんにちは", "カタカナ", "ひらがな", "ｶﾀｶﾅ", "ー", "ゔ", "ヴ", "が", "パ", "ㇰ"]
HANGUL = ["한국어", "안녕하세요", "가", "힣", "ㄱ", "ㅏ", "\u1100\u1161", "\u1100\u1161\u11a8", "\u110b\u1175", "각\u11a8"]
ARABIC = ["مرحبا", "بالعالم", "العربية", "ﷺ", "ﻻ", "٣", "٠١٢", "۴۵", "\u064b", "\u0651\u064e", "فارسی", "اردو"]
HEBREW = ["שלום", "עברית", "בְּרֵאשִׁית", "\u05b0", "ﬠ", "יִ"]
DEVANAGARI = ["हिन्दी", "नमस्ते", "क़", "क\u093c", "\u0915\u094d\u0937", "१२३", "ॐ", "\u0903", "ड़"]
THAI = ["ภาษาไทย", "สวัสดี", "๑๒๓", "ก", "\u0e33", "\u0e4d\u0e32"]
OTHER_SCRIPTS = ["ქართული", "Հայերեն", "አማርኛ", "ᚠᚢᚦ", "ꦗꦮ", "ᠮᠣᠩᠭᠣᠯ", "བོད", "ខ្មែរ", "ລາວ", "မြန်မာ", "ᏣᎳᎩ", "ꓐꓑ",
                 "𐌰𐌱", "𝐀𝐁𝐂", "𝕏", "ℌ", "ℵ", "ǂ", "ʼ", "ˆ", "ꜰ"]
SCRIPTS = (LATIN, ACCENTED, GREEK, CYRILLIC, CJK, KANA, HANGUL, ARABIC, HEBREW, DEVANAGARI, THAI, OTHER_SCRIPTS)

# Runs of these: the split regex treats \s, \r and \n apart, Rust's is_whitespace decides lstrip/rstrip.
SPACES = [" ", "\t", "\n", "\r\n", "\r", "\u000b", "\u000c", "\u0085", "\u00a0", "\u1680", "\u2000", "\u2001",
          "\u2002", "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a", "\u2028", "\u2029",
          "\u202f", "\u205f", "\u3000", "\u180e", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u001c", "\u001d",
          "\u001e", "\u001f"]
DIGITS = "0123456789"
NUMBER_FORMS = ["1,080", "3.14", "3.14159", "-5", "+7", "1e9", "2.5e-3", "$12.50", "50%", "1/2", "0.5", "007", "1_000",
                "12:30", "2024-01-31", "１２３", "٣٤", "१२", "๓", "²", "³", "½", "¼", "Ⅻ", "ⅷ", "①", "⑳", "⒈", "𝟙", "𝟡",
                "〇", "一二三", "∞", "#### 72", "<<48/2=24>>24", "$1,234.56", "10^6", "9,999,999"]
PUNCTUATION = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + [
    "...", "…", "—", "–", "«", "»", "“", "”", "‘", "’", "¿", "¡", "§", "¶", "†", "•", "·", "→", "⇒", "≤", "≥", "≠", "±",
    "×", "÷", "√", "∑", "∫", "€", "£", "¥", "₹", "₿", "©", "®", "™", "°", "‰", "′", "″", "◆", "★", "♥", "♪", "─", "┼",
    "░", "⌘", "⟨", "⟩", "、", "〜", "ー", "・", "﹏", "！", "？", "￥", "\u00ad", "\ufffd", "\ue000", "\U000f0000", "?!",
    "!!!", "---", "***", "```", "//", "/*", "*/", "->", "=>", "::", "&&", "||", "<b>", "</b>", "\\n", "\\\\"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
CONTRACTION_WORDS = ["it", "don", "they", "we", "I", "you", "she", "can", "LET", "WON", "x", "9", " ", "", "'", "’"]
EMOJI = ["😀", "🤖", "👍", "🚀", "❤", "❤️", "☺", "☺︎", "✔️", "⭐", "🙂", "🫠", "🥲", "🇫🇷", "🇯🇵", "🇺🇳", "🏳️‍🌈",
         "🏴‍☠️", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🧑🏿‍🤝‍🧑🏻", "👍🏻", "👍🏿", "✋🏼", "1️⃣", "#️⃣", "*️⃣",
         "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f", "\u200d", "\ufe0f", "\ufe0e", "🏻",
         "\U0001f1e6", "😀😀😀", "🐈‍⬛", "©️", "™️", "🀄", "🃏", "🆗", "🈚"]
# Combining marks: NFC must compose some (e + U+0301 -> é) and reorder others by combining class.
COMBINING = ([chr(c) for c in range(0x0300, 0x0370)] + [chr(c) for c in range(0x1AB0, 0x1ABF)] +
             [chr(c) for c in range(0x1DC0, 0x1DF6)] + [chr(c) for c in range(0x20D0, 0x20F1)] +
             [chr(c) for c in range(0xFE20, 0xFE30)] +
             ["\u0483", "\u0591", "\u05b4", "\u05bc", "\u0610", "\u064e", "\u0670", "\u093c", "\u094d", "\u0bcd",
              "\u0e38", "\u0f71", "\u0f72", "\u0f74", "\u302a", "\u3099", "\u309a", "\U0001d165", "\U0001d16d",
              "\U0001e944", "\u0cd5", "\u0b3e", "\u0b57", "\u0d3e", "\u0dcf", "\u102e", "\u1b35", "\U000110ba",
              "\U0001133e", "\U000114b0", "\U000115af"])
# What NFC changes on its own: singletons (Kelvin sign -> K, CJK compatibility ideographs), non-starter decompositions.
SINGLETONS = ["\u212a", "\u212b", "\u2126", "\u0340", "\u0341", "\u0343", "\u0344", "\u0374", "\u037e", "\u0387",
              "\u1f71", "\u1fee", "\u2000", "\u2329", "\uf900", "\ufa10", "\U0002f800", "\u0f73", "\u0f75", "\u0f81",
              "\u0958", "\u09dc", "\ufb1d", "\ufb2a", "\u2adc"]
BASES = list("aeiouAEIOUcnsyzgkhwtCNSZGKHWTxq") + ["ω", "α", "Α", "и", "е", "у", "К", "ё", "ا", "و", "ي", "ה", "ש",
                                                  "क", "ग", "ଖ", "க", "ஒ", "ಕ", "ೆ", "ക", "ෙ", "ဥ", "ᬅ", "か", "は",
                                                  "ウ", "ㄱ", "\u1100", "\u1112", "\U00011099", "\U00011131",
                                                  "\U00011347", "\U000114b9", "\U000115b8", "\U00011935", " ", "1",
                                                  "_", "'"]
SPECIAL_WHOLE = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                 "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
                 "<|file_sep|>"]
SPECIAL_FRAGMENTS = ["<|im_", "|>", "<|im_start|", "<|", "|", "im_end|>", "<|endoftext", "endoftext|>", "<tool_",
                     "</tool", "_call>", "<|IM_END|>", "<| im_end |>", "<<|im_end|>>", "<|im_start|>assistant\n",
                     "<|im_end|>\n", "<|im_<|im_end|>start|>", "<|fim_", "<|im_start|><|im_start|>", "< |im_end|>",
                     "<|im_end|>\u0301", "<|endoftext|>'s", "<|im_ end|>", "＜|im_end|＞"]
RUNS = ["a", "ab", "Z", "=", "-", "_", "*", " ", "  ", "\n", "\r\n", "\t", " \n", "7", "12", "你", "가", "😀", "é",
        "e\u0301", "'s", ".", "!?", "<|", "|>", "\u00a0", "\u3000", "ĠĠ", "\U0001d400", "aé", "\u0301"]
CONTROLS = ["\x00", "\x01", "\x07", "\x08", "\x1b", "\x7f", "\x80", "\x9f", "\u061c", "\u200e", "\u200f", "\u202e",
            "\u2066"]
GSM8K_TEMPLATES = [
    "{name} had {a} apples. She gave {b} to {other}. How many apples does {name} have left?",
    "If {a} people each pay ${b}.{c2}, what is the total?",
    "{name} runs {a} miles a day for {b} days. That is {a}*{b} = <<{a}*{b}={ab}>>{ab} miles.\n#### {ab}",
    "A store sells {a} pens at ${b} each and {c} notebooks at ${c}.{c2} each. Total: ${ab}.",
    "{name}'s dog weighs {a} pounds; it's {b}% heavier than {other}'s. They'll need {c} bags.",
    "Step 1: {a} + {b} = {apb}\nStep 2: {apb} x {c} = {apbc}\nThe answer is {apbc}.",
    "<think>\n{a}/{b} = {q}\n</think>\n<answer>\n{q}\n</answer>\n",
]
NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Mark", "Albert", "Ken", "Alexis", "Tina", "José", "Zoë", "李雷"]


def load_gsm8k(shared, lines_read=400):
    """The questions and answers of GSM8K's first `lines_read` training lines, or none when the data is absent."""
    path = os.path.join(shared, "data", "gsm8k", "train.jsonl")
    if not os.path.exists(path):
        return []
    texts = []
    with open(path, encoding="utf-8") as lines:
        for i, line in enumerate(lines):
            if i >= lines_read:
                break
            item = json.loads(line)
            texts += [item["question"], item["answer"]]
    return texts


def random_code_point(rng):
    """Any assigned scalar value, mostly from the BMP, or a noncharacter. No surrogates (a str holding one cannot be
    encoded as UTF-8), and nothing that this Python's Unicode tables call unassigned (they are 16.0 in the sid root's
    Python, as are those of tokenizers' Oniguruma): a newer utf8proc (Debian sid's) may know code points that neither
    tokenizers nor this Python do. Letters and digits of Unicode 15.0 and 16.0 are drawn like any others: our
    split regex takes \\p{L} and \\p{N} from Unicode 16.0 whatever the build's PCRE2 has (pre_tokenizer.cpp)."""
    while True:
        roll = rng.random()
        if roll < 0.15:
            code = rng.randrange(0x20, 0x250)
        elif roll < 0.85:
            code = rng.randrange(0x250, 0x10000)
        elif roll < 0.98:
            code = rng.randrange(0x10000, 0x32400)
        else:
            code = rng.randrange(0xE0000, 0x110000)
        char = chr(code)
        noncharacter = 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE
        if 0xD800 <= code <= 0xDFFF or (unicodedata.category(char) == "Cn" and not noncharacter):
            continue
        return char


def gsm8k_like(rng):
    """A made-up GSM8K question or worked answer, with its numbers, $, %, <<...>> and #### marks."""
    a, b, c = rng.randrange(2, 500), rng.randrange(1, 100), rng.randrange(1, 60)
    values = dict(name=rng.choice(NAMES), other=rng.choice(NAMES), a=a, b=b, c=c, c2=f"{rng.randrange(100):02d}",
                  ab=a * b, apb=a + b, apbc=(a + b) * c, q=round(a / b, rng.randrange(0, 4)))
    return rng.choice(GSM8K_TEMPLATES).format(**values)


def piece(rng, gsm8k):
    """One piece of a string, of a randomly chosen kind."""
    kind = rng.randrange(16)
    if kind == 0:
        return rng.choice(rng.choice(SCRIPTS))
    if kind == 1:
        return "".join(rng.choice(SPACES) for _ in range(rng.randrange(1, 6)))
    if kind == 2:
        return rng.choice(" \t\n") * rng.randrange(1, 12)
    if kind == 3:
        return "".join(rng.choice(DIGITS) for _ in range(rng.randrange(1, 40)))
    if kind == 4:
        return rng.choice(NUMBER_FORMS)
    if kind == 5:
        return "".join(rng.choice(PUNCTUATION) for _ in range(rng.randrange(1, 4)))
    if kind == 6:
        suffix = rng.choice(CONTRACTIONS)
        suffix = "".join(c.upper() if rng.random() < 0.4 else c for c in suffix)
        if rng.random() < 0.1:  # U+017F LONG S, which case-insensitive matching takes for an s
            suffix = suffix.replace("s", "\u017f").replace("S", "\u017f")
        return rng.choice(CONTRACTION_WORDS) + suffix + rng.choice(["", " ", "s", "x", "\n", "'", "ſ", "K"])
    if kind == 7:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randrange(1, 4)))
    if kind == 8:  # a base and stacked marks
        return rng.choice(BASES) + "".join(rng.choice(COMBINING) for _ in range(rng.randrange(1, 5)))
    if kind == 9:  # decomposed forms that NFC composes again
        word = rng.choice(rng.choice((ACCENTED, GREEK, CYRILLIC, HANGUL, KANA, DEVANAGARI, HEBREW, SINGLETONS)))
        return unicodedata.normalize(rng.choice(("NFD", "NFKD", "NFD", "NFC")), word)
    if kind == 10:
        return rng.choice(SPECIAL_WHOLE)
    if kind == 11:
        whole = rng.choice(SPECIAL_WHOLE)
        start = rng.randrange(len(whole))
        return rng.choice((rng.choice(SPECIAL_FRAGMENTS), whole[start:rng.randrange(start + 1, len(whole) + 1)]))
    if kind == 12:
        if gsm8k and rng.random() < 0.6:
            text = rng.choice(gsm8k)
            start = rng.randrange(len(text))
            return text[start:start + rng.randrange(1, 300)]
        return gsm8k_like(rng)
    if kind == 13:
        if rng.random() < 0.2:
            return rng.choice(CONTROLS)
        return "".join(random_code_point(rng) for _ in range(rng.randrange(1, 4)))
    if kind == 14:  # a long run, whose piece may be too long for the piece cache of either side
        return rng.choice(RUNS) * rng.randrange(10, 150)
    return rng.choice(LATIN) + rng.choice(["", " ", " ", "\n"])


def random_text(rng, gsm8k):
    """A string of 0 to a few hundred characters."""
    roll = rng.random()
    if roll < 0.02:
        return ""
    target = rng.choice((8, 30, 100, 300))
    parts = []
    length = 0
    while length < target and rng.random() > 0.03:
        part = piece(rng, gsm8k)
        if rng.random() < 0.3:
            part += rng.choice((" ", " ", "\n", "", "\t"))
        parts.append(part)
        length += len(part)
    text = "".join(parts)
    if len(text) > 400:
        text = text[:400]
    return text


def random_ids(rng, tokenizer, vocab_size, partial_ids):
    """An id sequence for decode: byte tokens whose bytes are cut UTF-8, special tokens, any id."""
    ids = []
    for _ in range(rng.randrange(0, 40)):
        roll = rng.random()
        if roll < 0.35:
            ids.append(rng.choice(partial_ids))
        elif roll < 0.5:
            ids.append(rng.randrange(151643, vocab_size))
        else:
            ids.append(rng.randrange(vocab_size))
    if rng.random() < 0.3:  # a real encoding cut in the middle of a character, or with an added token inside it
        text = rng.choice(CJK + EMOJI + HANGUL + THAI)
        encoded = tokenizer.encode(text, add_special_tokens=False).ids
        cut = rng.randrange(len(encoded) + 1)
        if rng.random() < 0.5:
            ids += encoded[:cut] + [rng.randrange(151643, vocab_size)] + encoded[cut:]
        else:
            ids += encoded[:cut]
    return ids


def partial_utf8_ids(tokenizer):
    """Ids of vocabulary tokens whose bytes are not valid UTF-8 on their own (byte tokens 0x80..0xFF, parts of CJK)."""
    byte_of = bytes_to_unicode_inverse()
    partial = []
    for token, token_id in tokenizer.get_vocab(with_added_tokens=False).items():
        try:
            bytes(byte_of[c] for c in token).decode("utf-8")
        except UnicodeDecodeError:
            partial.append(token_id)
    return sorted(partial)


def bytes_to_unicode_inverse():
    """GPT-2's byte-level alphabet, character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    code_points, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            code_points[byte] = byte
        else:
            code_points[byte] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in code_points.items()}


def write(out_dir, seed, count):
    """Writes out_dir/tokenizer_cases.json with `count` strings and 1 decode case per 50 strings (at least 300);
    returns the facts."""
    started = time.monotonic()
    shared = os.environ.get("DAPO_SHARED_DIR", "")
    path = os.path.join(shared, "fixtures", "tokenizer", "qwen2.5", "tokenizer.json")
    if not os.path.exists(path):
        raise SystemExit(f"tokenizer_cases: {path} not found (set DAPO_SHARED_DIR to the shared/ directory)")
    tokenizer = tokenizers.Tokenizer.from_file(path)
    rng = random.Random(seed)
    gsm8k = load_gsm8k(shared)
    texts, newer_marks = [], 0
    while len(texts) < count:
        text = random_text(rng, gsm8k)
        # tokenizers' NFC has Unicode 9.0 tables: marks assigned later are starters to it and are not reordered, and
        # later compositions (U+11935 U+11930 -> U+11938) are not made, while utf8proc applies them. A version
        # difference again: strings whose NFC by tokenizers differs from Python's (Unicode 16.0) are left out.
        if tokenizer.normalizer.normalize_str(text) != unicodedata.normalize("NFC", text):
            newer_marks += 1
            continue
        texts.append(text)
    encodings = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    decoded = tokenizer.decode_batch(encodings, skip_special_tokens=False)
    decoded_skip = tokenizer.decode_batch(encodings, skip_special_tokens=True)
    cases = [{"text": t, "ids": i, "decoded": d, "decoded_skip_special": s}
             for t, i, d, s in zip(texts, encodings, decoded, decoded_skip)]

    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    partial = partial_utf8_ids(tokenizer)
    id_lists = [random_ids(rng, tokenizer, vocab_size, partial) for _ in range(max(300, count // 50))]
    decode_cases = [{"ids": i, "decoded": d, "decoded_skip_special": s} for i, d, s in
                    zip(id_lists, tokenizer.decode_batch(id_lists, skip_special_tokens=False),
                        tokenizer.decode_batch(id_lists, skip_special_tokens=True))]

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer_cases.json"), "w", encoding="utf-8") as out:
        json.dump({"seed": seed, "tokenizers": tokenizers.__version__, "count": count, "cases": cases,
                   "decode_count": len(decode_cases), "decode_cases": decode_cases}, out, ensure_ascii=False)
    return {"file": "tokenizer_cases.json", "count": count, "decode_count": len(decode_cases), "seed": seed,
            "left_out_for_newer_marks": newer_marks, "tokenizers": tokenizers.__version__,
            "python": sys.version.split()[0], "unicodedata": unicodedata.unidata_version,
            "seconds": round(time.monotonic() - started, 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(write(args.out_dir, args.seed, args.count)))


if __name__ == "__main__":
    main()
