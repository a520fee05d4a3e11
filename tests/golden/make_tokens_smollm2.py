#!/usr/bin/env python3
"""Writes tests/data/smollm2_tokens.json: the token ids of a corpus of awkward text (many
scripts, emoji, odd whitespace, digits, contractions, code, control tokens) under SmolLM2's
tokenizer, from Hugging Face's `tokenizers` library built from the GGUF file's vocabulary and
merges (read by llama.cpp's `gguf` package) with SmolLM2's pre-tokenizer: every digit split
off, then GPT-2's byte-level regex. The oracle of qkv's byte-level BPE. Also conversations
rendered by the file's own chat template (Jinja2, as transformers renders it) and tokenized
so: the oracle of qkv::Chat's ChatML.
   scripts/get-models && pip install gguf tokenizers jinja2 && python3 tests/golden/make_tokens_smollm2.py
"""
import json
import os

import jinja2

import smollm2

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "smollm2_tokens.json")
r = smollm2.reader()
tok, tokens, merges = smollm2.tokenizer(r)
GGUF = smollm2.GGUF
from tokenizers import Tokenizer, models  # noqa: E402

corpus = [
    "Hello, world!",
    "The capital of France is Paris.",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "don't, I'll, we've, they're, she's, I'm, he'd; DON'T 'quoted' ''",
    "Numbers: 3.14159, 1,000,000 and 2026-12-02; ١٢٣ ٤٥ (Arabic-Indic), ⅣⅫ, ½ ²",
    "Größe, naïve café, Ærøskøbing, İstanbul, ß",
    "Здравствуй, мир! Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε — ελληνικά",
    "日本語のテキスト、漢字とかな。中文：你好，世界！한국어 문장입니다.",
    "हिन्दी में वाक्य, தமிழ், ภาษาไทย",
    "עברית ועربية: مرحبا بالعالم",
    "Emoji: 😀😃🙈 👩‍💻 🇫🇷 ❤️ 👍🏽 and a family 👨‍👩‍👧‍👦",
    "Odd whitespace:\u00a0nbsp\u2003em\u3000ideographic\u200bzero-width\u2028line\u2029para\u0085nel",
    "def f(x):\n    return x ** 2  # square\n\n\tif x != 0: print(f'{x!r}')",
    "<html><body class=\"a b\">&amp; &lt;tag&gt;</body></html>",
    "a" * 300,
    " " * 17 + "x" + "\n" * 5,
    "!!!???...,,,;;;:::---___***",
    "mixedCASE camelCase snake_case kebab-case SCREAMING",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> inside and <|im_end|>",
    "",
    " ",
    "\n",
]
cases = []
for text in corpus:
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text, text
    cases.append({"text": text, "special": True, "ids": ids})
# Without special-token parsing, the control tokens' text is plain text.
for text in corpus[-5:-3]:
    enc = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    enc.pre_tokenizer = tok.pre_tokenizer
    cases.append({"text": text, "special": False, "ids": enc.encode(text).ids})

template = jinja2.Environment().from_string(bytes(r.fields["tokenizer.chat_template"].parts[-1]).decode())
conversations = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a pirate. Answer in one line."},
     {"role": "user", "content": "Hi there!"},
     {"role": "assistant", "content": "Arr, ahoy matey!"},
     {"role": "user", "content": "Tell me a joke about 42 parrots 🦜\n\nin two lines."}],
]
chats = []
for messages in conversations:
    text = template.render(messages=messages, add_generation_prompt=True)
    chats.append({"messages": messages, "rendered": text, "ids": tok.encode(text, add_special_tokens=False).ids})

with open(OUT, "w") as f:
    json.dump({"source": "tokenizers " + __import__("tokenizers").__version__ + " over " + os.path.basename(GGUF),
               "cases": cases, "chats": chats}, f, ensure_ascii=False, indent=0)
print(OUT, len(cases), "cases,", sum(len(c["ids"]) for c in cases), "tokens")
