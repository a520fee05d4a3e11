"""Models, tokenizers, generation, the worked example and attention maps from Python."""
import os
import shutil

import numpy as np
import pytest

import qkv
from conftest import source_dir


@pytest.fixture(scope="module")
def stories():
    return qkv.load_llama2c(qkv.stories260k_path())


def test_the_package_is_the_installed_one_and_carries_the_model():
    assert "site-packages" in qkv.__file__ or "dist-packages" in qkv.__file__, qkv.__file__
    assert os.path.getsize(qkv.stories260k_path()) == 1_056_540
    assert qkv.current_target() in qkv.supported_targets()


def test_greedy_text_is_the_reference(stories):
    # models/stories260K/README.md: greedy from "Once upon a time", 200 positions, this text.
    with open(os.path.join(source_dir(), "models", "stories260K", "greedy_once_upon_a_time.txt")) as f:
        expected = f.read()
    pieces = list(stories.generate("Once upon a time", max_tokens=196, temperature=0))
    assert len(pieces) > 100  # streamed piece by piece
    assert "Once upon a time" + "".join(pieces) + "\n" == expected


def test_tokens_sampling_and_the_tokenizer(stories):
    tok = stories.tokenizer
    assert tok.vocab_size == 512 and tok.bos == 1
    assert tok.encode("Once upon a time") == [1, 403, 407, 261, 378]  # the model's README
    a = list(stories.tokens("Lily", max_tokens=30, temperature=0.8, seed=7))
    b = list(stories.tokens("Lily", max_tokens=30, temperature=0.8, seed=7))
    c = list(stories.tokens("Lily", max_tokens=30, temperature=0.8, seed=8))
    assert a == b and a != c and len(a) <= 30
    # The greedy first token is the argmax of a full forward's last logits.
    logits = stories.logits("Once upon a time")
    assert logits.shape == (5, 512)
    assert next(stories.tokens("Once upon a time", max_tokens=1, temperature=0)) == int(np.argmax(logits[-1]))
    # Multi-byte characters that span byte tokens come out whole.
    text = "".join(stories.generate("café 日本", max_tokens=3, temperature=0))
    assert "\ufffd" not in text
    with pytest.raises(ValueError, match="max_tokens"):
        next(stories.generate("x", max_tokens=0))
    with pytest.raises(ValueError, match="vocabulary"):
        next(stories.tokens([1, 9999], max_tokens=2))


def test_checkpoints_load_and_run():
    m = qkv.load_checkpoint(os.path.join(source_dir(), "fuzz", "corpus", "checkpoint", "gpt2.safetensors"))
    assert m.config["d_model"] == 8 and m.tokenizer is None
    assert len(list(m.tokens([1, 2], max_tokens=4, temperature=0))) == 4
    with pytest.raises(ValueError, match="no tokenizer"):
        next(m.generate("hi"))


def test_bad_files_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        qkv.load_llama2c(tmp_path / "missing.bin")
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError):
        qkv.load_llama2c(bad)
    with pytest.raises(ValueError):
        qkv.load_checkpoint(bad)
    src = os.path.join(source_dir(), "fuzz", "corpus", "checkpoint", "gpt2.safetensors")
    data = bytearray(open(src, "rb").read())
    data[30:40] = b"!!!!!!!!!!"  # inside the JSON header
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="not valid JSON"):
        qkv.load_checkpoint(broken)
    # A model without a tokenizer beside it loads for token-id prompts.
    lone = tmp_path / "lone.bin"
    shutil.copy(qkv.stories260k_path(), lone)
    assert qkv.load_llama2c(lone).tokenizer is None


def test_explain_is_the_articles_worked_example():
    e = qkv.explain()
    assert e.tokens == ["fluffy", "blue", "creature"]
    # creature's query (2, 1) against the keys (1, 1), (0, 2), (2, 0): dot products 3, 2, 4,
    # scaled by 1/√2, softmax, then the weighted sum of the values, by hand.
    raw = np.array([3.0, 2.0, 4.0])
    w = np.exp(raw / np.sqrt(2)) / np.exp(raw / np.sqrt(2)).sum()
    np.testing.assert_allclose(e.raw_scores[2], raw)
    np.testing.assert_allclose(e.weights[2], w, rtol=1e-12)
    np.testing.assert_allclose(e.output[2], w @ np.array([[1, 0], [0, 2], [3, 1]]), rtol=1e-12)
    np.testing.assert_allclose(e.weights.sum(1), 1.0)
    c = qkv.explain(causal=True)
    assert c.masked[0].tolist() == [False, True, True] and c.weights[0, 1] == 0.0


def test_explain_your_own_numbers(rng):
    q, k, v = rng.standard_normal((2, 3)), rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    e = qkv.explain(q, k, v, tokens=["a", "b"], key_tokens=["w", "x", "y", "z"])
    s = q @ k.T / np.sqrt(3)
    w = np.exp(s) / np.exp(s).sum(1, keepdims=True)
    np.testing.assert_allclose(e.weights, w, rtol=1e-12)
    np.testing.assert_allclose(e.output, w @ v, rtol=1e-12)
    with pytest.raises(ValueError, match="same width"):
        qkv.explain(q, k[:, :2], v)
    with pytest.raises(ValueError, match="all of q, k and v"):
        qkv.explain(q, k)


def test_attention_map(stories):
    m = qkv.attention_map(stories, "Lily saw a cat. The cat saw Lily")
    L, H, T, _ = m.weights.shape
    assert (L, H) == (5, 8) and T == len(m.tokens) and m.tokens[0] == "<s>"
    np.testing.assert_allclose(m.weights.sum(-1), 1.0, rtol=1e-5)
    assert np.all(m.weights[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0)  # causal
    page = m._repr_html_()
    assert page.startswith("<iframe srcdoc=") and "Attention of stories260K.bin" in m.html
    ids = qkv.attention_map(stories, [1, 403, 407])
    assert ids.tokens == ["1", "403", "407"]
    with pytest.raises(ValueError, match="at most 256"):
        qkv.attention_map(stories, "a " * 300)


def test_gguf_models_load():
    # tests/golden/make_gguf_llama.py: a random quantized Llama, and its logits from NumPy.
    import json
    path = os.path.join(source_dir(), "tests", "data", "tiny_llama.gguf")
    golden = json.load(open(path + ".json"))
    want = np.array(golden["logits"])
    for dequantize in (False, True):
        m = qkv.load_gguf(path, dequantize=dequantize)
        assert m.config["n_layers"] == 2 and m.tokenizer is None
        np.testing.assert_allclose(m.logits(golden["tokens"]), want, atol=1e-4 * np.abs(want).max())
    # Its Q8_0, Q4_0 and Q4_1 matrices with int8 activations: the logits move by the rounding
    # (2.7% of the largest here: random weights, two layers), not by a wrong product.
    m = qkv.load_gguf(path, matmul="int8")
    got = m.logits(golden["tokens"])
    assert np.abs(got - want).max() > 1e-4 * np.abs(want).max()  # the int8 products ran
    np.testing.assert_allclose(got, want, atol=0.06 * np.abs(want).max())
    with pytest.raises(ValueError, match="not a GGUF file"):
        qkv.load_gguf(qkv.stories260k_path())


def test_k_quant_files():
    # tests/golden/make_quant_llama.py: a random Llama quantized to Q4_K and Q6_K by llama.cpp's
    # own quantizer, and the logits of a NumPy forward over its dequantized weights.
    import json
    data = os.path.join(source_dir(), "tests", "data")
    golden = json.load(open(os.path.join(data, "quant_llama.json")))
    for t in ("q4_k", "q6_k"):
        path = os.path.join(data, f"quant_llama.{t}.gguf")
        want = np.array(golden["logits"][t])
        scale = np.abs(want).max()
        np.testing.assert_allclose(qkv.load_gguf(path).logits(golden["tokens"]), want,
                                   atol=1e-5 * scale)
        got = qkv.load_gguf(path, matmul="int8").logits(golden["tokens"])
        assert np.abs(got - want).max() > 1e-5 * scale  # the int8 products ran
        np.testing.assert_allclose(got, want, atol=1e-2 * scale)


def smollm2_path():
    # scripts/get-models puts it here (make test runs it); missing, the test fails.
    path = os.path.join(source_dir(), "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert os.path.exists(path), f"{path} not found: run scripts/get-models"
    return path


def test_smollm2_generates_with_its_own_tokenizer():
    m = qkv.load_gguf(smollm2_path())
    tok = m.tokenizer
    assert tok.vocab_size == 49152 and tok.eos == 2
    ids = tok.encode("The capital of France is")
    assert ids == [504, 3575, 282, 4649, 314]  # llama.cpp's and Hugging Face's tokenization
    assert tok.encode("<|im_start|>", special=True) == [1]
    text = "".join(m.generate("The capital of France is", max_tokens=8, temperature=0))
    assert text.startswith(" Paris"), text
    # In place and dequantized: the same logits (the fused kernels against the fp32 path).
    ref = qkv.load_gguf(smollm2_path(), dequantize=True)
    a, b = m.logits(ids), ref.logits(ids)
    np.testing.assert_allclose(a, b, atol=1e-4 * np.abs(b).max())
    # Attention maps of the model in place (its full forward over the block matrices) against
    # the dequantized model's.
    in_place, fp32 = qkv.attention_map(m, ids), qkv.attention_map(ref, ids)
    assert in_place.weights.shape == fp32.weights.shape == (30, 9, len(ids), len(ids))
    np.testing.assert_allclose(in_place.weights, fp32.weights, atol=1e-4)


def test_smollm2_with_int8_products():
    # llama.cpp's arithmetic: activations rounded to int8 blocks. The logits move by about the
    # rounding (a fraction of a percent of the largest), the text not at all here.
    exact = qkv.load_gguf(smollm2_path())
    m = qkv.load_gguf(smollm2_path(), matmul="int8")
    assert m.matmul == "int8" and exact.matmul == "exact"
    ids = m.encode("The capital of France is")
    a, b = m.logits(ids), exact.logits(ids)
    assert not np.array_equal(a, b)  # the int8 products ran
    np.testing.assert_allclose(a, b, atol=0.05 * np.abs(b).max())
    assert (a.argmax(axis=1) == b.argmax(axis=1)).mean() >= 0.8
    text = "".join(m.generate("The capital of France is", max_tokens=8, temperature=0))
    assert text.startswith(" Paris"), text
    m.matmul = "exact"
    np.testing.assert_array_equal(m.logits(ids), b)
    # Perplexity, llama-perplexity's windows, both arithmetics: within 1% of each other, and the
    # last window's scored predictions as from the logits.
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 40)
    p_exact = m.perplexity(text, ctx=64)
    m.matmul = "int8"
    p_int8 = m.perplexity(text, ctx=64)
    assert p_exact["chunks"] >= 3 and p_exact["scored"] == p_exact["chunks"] * 31
    assert abs(p_int8["perplexity"] / p_exact["perplexity"] - 1) < 0.01
    assert p_exact["cache_rotation"] == "off"
    m.matmul = "exact"
    rotated = m.perplexity(text, ctx=64, cache="f32", cache_rotation="on")
    assert rotated["cache_rotation"] == "on"
    assert abs(rotated["perplexity"] / p_exact["perplexity"] - 1) < 1e-5  # exact in real arithmetic
    toks = m.tokenizer.encode(text)
    k = p_exact["chunks"] - 1
    chunk = toks[k * 64:(k + 1) * 64]
    z = m.logits(chunk).astype(np.float64)
    logp = z - z.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    nll_last = -np.mean([logp[j, chunk[j + 1]] for j in range(32, 63)])
    n = p_exact["chunks"]
    before = np.log(p_exact["chunk_perplexity"][-2]) * (n - 1)
    np.testing.assert_allclose(np.log(p_exact["perplexity"]) * n - before, nll_last, rtol=1e-4)
    with pytest.raises(ValueError, match="exact or int8"):
        m.matmul = "fp8"


def test_smollm2_generates_and_chats_from_16_bit_and_block_caches():
    m = qkv.load_gguf(smollm2_path())
    for cache in ("bf16", "f16", "q8_0", "q4_0", "q4_1"):
        text = "".join(m.generate("The capital of France is", max_tokens=8, temperature=0,
                                  cache=cache))
        assert text.startswith(" Paris"), (cache, text)
    for cache in ("bf16", "q8_0"):
        chat = qkv.Chat(m, temperature=0, max_reply=16, cache=cache)
        assert "Paris" in chat.reply("What is the capital of France?"), cache
    # A q4_0 cache rotates by default; across turns and a reset, with and without it. Rotated,
    # the answer is right; unrotated, 4 bits cost SmolLM2 about a quarter of its perplexity and
    # its answer tips on the fp32 sums of the SIMD target (AVX-512 answered Paris, AVX2 and SSE4
    # "La femme de France…", with exact scores too): only that a reset starts over exactly.
    replies = {}
    for rotation in ("auto", "off"):
        chat = qkv.Chat(m, temperature=0, max_reply=16, cache="q4_0", cache_rotation=rotation)
        replies[rotation] = chat.reply("What is the capital of France?")
        chat.reply("And of Italy?")
        chat.reset()
        assert chat.reply("What is the capital of France?") == replies[rotation], rotation
    assert "Paris" in replies["auto"], replies
    text = "".join(m.generate("The capital of France is", max_tokens=8, temperature=0,
                              cache="f32", cache_rotation="on"))
    assert text.startswith(" Paris"), text
    with pytest.raises(ValueError, match="auto, on or off"):
        next(m.generate("x", cache="q4_0", cache_rotation="yes"))
    with pytest.raises(ValueError, match="f32, bf16, f16, q8_0, q4_0 or q4_1"):
        next(m.generate("x", cache="fp8"))
    with pytest.raises(ValueError, match="f32, bf16, f16, q8_0, q4_0 or q4_1"):
        qkv.Chat(m, cache="int4")


def test_smollm2_decodes_a_block_cache_with_int8_or_exact_scores():
    m = qkv.load_gguf(smollm2_path())
    # Perplexity through the decoding kernels (decode=True) over a q8_0 cache: the query's (and
    # P's) rounding to int8 moves it by well under a percent from the exact path.
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 20)
    exact = m.perplexity(text, ctx=64, cache="q8_0", cache_scores="exact", decode=True)
    int8 = m.perplexity(text, ctx=64, cache="q8_0", decode=True)
    assert exact["cache_scores"] == "exact" and int8["cache_scores"] == "int8"
    assert exact["decode"] and int8["decode"]
    assert abs(int8["perplexity"] / exact["perplexity"] - 1) < 0.005
    windows = m.perplexity(text, ctx=64, cache="q8_0")  # the tiled forward: exact either way
    assert not windows["decode"]  # (other kernels, other fp32 sums: 2e-4 apart here)
    assert abs(windows["perplexity"] / exact["perplexity"] - 1) < 1e-3
    for scores in ("int8", "exact"):
        text = "".join(m.generate("The capital of France is", max_tokens=8, temperature=0,
                                  cache="q4_1", cache_scores=scores))
        assert text.startswith(" Paris"), (scores, text)
    chat = qkv.Chat(m, temperature=0, max_reply=16, cache="q8_0", cache_scores="exact")
    assert "Paris" in chat.reply("What is the capital of France?")
    with pytest.raises(ValueError, match="int8 or exact"):
        next(m.generate("x", cache="q8_0", cache_scores="fp32"))
    with pytest.raises(ValueError, match="int8 or exact"):
        m.perplexity(text, ctx=64, cache_scores="yes")


def test_smollm2_keys_and_values_in_storages_of_their_own():
    m = qkv.load_gguf(smollm2_path())
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 20)
    # The same rows as the symmetric caches hold: q8_0 keys with q8_0 values is the q8_0 cache,
    # bit for bit, through the decoding kernels too.
    same = m.perplexity(text, ctx=64, cache="f32", cache_k="q8_0", cache_v="q8_0", decode=True)
    q8 = m.perplexity(text, ctx=64, cache="q8_0", decode=True)
    assert same["perplexity"] == q8["perplexity"]
    assert same["cache_k"] == same["cache_v"] == "q8_0"
    # Mixed: the cache says each storage, rotates (a block format), and decodes in place as the
    # windows compute it (other kernels, other fp32 sums).
    mixed = m.perplexity(text, ctx=64, cache_k="q8_0", cache_v="q4_0", decode=True)
    windows = m.perplexity(text, ctx=64, cache_k="q8_0", cache_v="q4_0")
    assert (mixed["cache_k"], mixed["cache_v"], mixed["cache_rotation"]) == ("q8_0", "q4_0", "on")
    assert abs(mixed["perplexity"] / windows["perplexity"] - 1) < 0.01
    # f16 keys beside q4_1 values.
    half = m.perplexity(text, ctx=64, cache_k="f16", cache_v="q4_1", decode=True)
    assert half["cache_k"] == "f16" and half["cache_rotation"] == "on"
    assert abs(half["perplexity"] / windows["perplexity"] - 1) < 0.05
    text = "".join(m.generate("The capital of France is", max_tokens=8, temperature=0,
                              cache_k="q8_0", cache_v="q4_0"))
    assert text.startswith(" Paris"), text
    chat = qkv.Chat(m, temperature=0, max_reply=16, cache_k="q8_0", cache_v="q4_1")
    assert "Paris" in chat.reply("What is the capital of France?")
    with pytest.raises(ValueError, match="f32, bf16, f16, q8_0, q4_0 or q4_1"):
        next(m.generate("x", cache_v="q5_0"))


def chatml(messages):
    """The ChatML text of `messages`, then the assistant's opening, as the template writes it."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + \
        "<|im_start|>assistant\n"


def test_chat_keeps_the_conversation_and_answers_as_generation_over_its_transcript():
    m = qkv.load_gguf(smollm2_path())
    tok = m.tokenizer
    chat = qkv.Chat(m, temperature=0, max_reply=16)  # the template's system prompt
    assert chat.system and chat.transcript == [{"role": "system", "content": chat.system}]
    start = list(chat.tokens)
    assert start == tok.encode(chatml([{"role": "system", "content": chat.system}])[:-len(
        "<|im_start|>assistant\n")], special=True)

    for turn, question in enumerate(("What is the capital of France?", "And of Germany?")):
        before = chat.transcript + [{"role": "user", "content": question}]
        # An independent road: generation over the whole conversation's tokens, from an empty
        # cache (the first turn from its text; later ones from the tokens drawn before, since a
        # reply's text need not tokenize back to the tokens the model drew).
        ids = tok.encode(chatml(before), special=True) if turn == 0 else list(chat.tokens) + \
            tok.encode(chatml(before[-1:]), bos=False, special=True)
        want = "".join(m.generate(ids, max_tokens=16, temperature=0))
        pieces = list(chat.stream(question))
        assert len(pieces) > 1 and "".join(pieces) == want
        assert chat.transcript == before + [{"role": "assistant", "content": want}]
        assert chat.stats["reply_tokens"] <= 16 and chat.stats["prompt_tokens"] > 0
    assert "Paris" in chat.transcript[2]["content"]

    # A reader who stops early stops the model; the conversation keeps what was drawn.
    stream = chat.stream("Name a river.")
    first = next(stream)
    stream.close()
    assert chat.stats["finished"] is False and chat.stats["reply_tokens"] <= 2
    assert chat.transcript[-1]["content"].startswith(first)

    chat.reset()
    assert list(chat.tokens) == start and len(chat.transcript) == 1

    # add() then respond(): a few-shot exchange, answered in one run.
    chat.add("user", "Capital of Italy?")
    chat.add("assistant", "Rome.")
    chat.add("user", "Capital of Spain?")
    ids = tok.encode(chatml(chat.transcript), special=True)
    assert "".join(chat.respond()) == "".join(m.generate(ids, max_tokens=16, temperature=0))


def test_chat_refuses_a_turn_that_does_not_fit_and_keeps_the_conversation():
    m = qkv.load_gguf(smollm2_path())
    chat = qkv.Chat(m, system="", context=32, temperature=0)
    tokens = list(chat.tokens)
    with pytest.raises(ValueError, match="do not fit in the"):
        chat.reply("tell me a story " * 20)
    assert list(chat.tokens) == tokens and chat.transcript == []
    assert chat.reply("Hi")  # the conversation goes on
    with pytest.raises(ValueError, match="chat template"):
        qkv.Chat(qkv.load_llama2c(qkv.stories260k_path()))
