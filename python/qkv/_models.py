"""Models, generation, the worked example and attention maps, for Python."""
import codecs
import html
import json
import os
import queue
import threading

import numpy as np

from . import _qkv


def stories260k_path():
    """The path of stories260K.bin (llama2.c, 260K parameters, MIT), which ships with qkv."""
    return os.path.join(os.path.dirname(__file__), "models", "stories260K", "stories260K.bin")


class Model:
    """A model to run: a llama2.c file (load_llama2c) or a qkv checkpoint (load_checkpoint)."""

    def __init__(self, file, path):
        self._file = file
        self.path = path

    @property
    def config(self):
        """The model's sizes and kinds as a dict (d_model, n_layers, n_heads, …)."""
        return self._file.config

    @property
    def num_params(self):
        return self._file.num_params

    @property
    def tokenizer(self):
        """The model's Tokenizer, or None (a model trained on a synthetic task)."""
        return self._file.tokenizer

    @property
    def matmul(self):
        """How products with Q8_0, Q4_0, Q4_1, Q4_K and Q6_K weights (a GGUF file's, in place)
        take their activations: "exact" (fp32) or "int8" (rounded to int8 per 32-block once per
        product, integer dot products: llama.cpp's arithmetic, which moves a model's perplexity
        by a fraction of a percent: docs/tuning.md). Settable; other weights are not affected."""
        return self._file.matmul

    @matmul.setter
    def matmul(self, mode):
        self._file.matmul = str(mode)

    def __repr__(self):
        c = self.config
        return (f"qkv.Model({os.path.basename(self.path)!r}: {self._file.format}, {c['n_layers']} layers, "
                f"{c['n_heads']} heads, d_model {c['d_model']}, {self.num_params:,} parameters)")

    def encode(self, text):
        """`text` as token ids (with BOS when the vocabulary has one)."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: give prompts as lists of token ids")
        return self.tokenizer.encode(text)

    def _ids(self, prompt):
        if isinstance(prompt, str):
            return self.encode(prompt)
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt needs at least one token")
        return ids

    def tokens(self, prompt, max_tokens=256, temperature=1.0, top_p=0.9, seed=1, top_k=0,
               cache="f32", cache_rotation="auto", cache_scores="int8", cache_k=None,
               cache_v=None):
        """The generated token ids, one at a time (a generator), with every option as
        generate() takes it: prompt, max_tokens, temperature, top_p, seed, top_k, cache,
        cache_rotation, cache_scores, cache_k, cache_v."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        ids = self._ids(prompt)
        g = self._file._generator(ids, len(ids) + max_tokens - 1, float(temperature), float(top_p),
                                  int(top_k), int(seed), str(cache), _storage(cache_k),
                                  _storage(cache_v), str(cache_rotation), str(cache_scores))
        while (token := g.next()) >= 0:
            yield token

    def generate(self, prompt, max_tokens=256, temperature=1.0, top_p=0.9, seed=1, top_k=0,
                 cache="f32", cache_rotation="auto", cache_scores="int8", cache_k=None,
                 cache_v=None):
        """Text after `prompt` (a string, or token ids), streamed piece by piece.

        A KV cache holds the keys and values: the prompt runs once, then each step runs one
        token. temperature 0 is greedy; otherwise sampling as llama2.c's run.c (the same seed
        gives the same text), with top_p (nucleus) and top_k (0 = off). Ends at max_tokens new
        tokens, at the model's context, or at the model's stop token (a llama2.c model starting a
        new story with BOS, a GGUF model's EOS). cache: how the KV cache stores keys and values,
        "f32"; "bf16" or "f16" (half the memory); "q8_0", "q4_0" or "q4_1" (32-value blocks
        with an fp16 scale, q4_1 with an fp16 offset too: 0.27, 0.14 or 0.16 of the memory, for
        head dims of whole 32s). Attention reads every storage in place. cache_rotation:
        "auto" (the default: the block formats store their rows rotated by a normalised
        Walsh-Hadamard transform, which cuts their quality cost; attention rotates the queries
        alike and the outputs back), "on" (any storage) or "off". cache_scores: how decoding
        meets a q8_0, q4_0 or q4_1 cache, "int8" (the default: each query rounded to int8 blocks
        against the stored integers, and on x86-64 P rounded to 8 bits for P·V) or "exact"
        (every key and value widened to fp32). cache_k, cache_v: the keys' or the values' storage
        when it is not `cache`'s (as llama.cpp's cache-type-k and cache-type-v options): "q8_0" keys with "q4_0"
        values cost little, 4-bit keys much more.
        """
        tok = self.tokenizer
        if tok is None:
            raise ValueError("this model has no tokenizer: use tokens() for token ids")
        ids = self._ids(prompt)
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # a character may span tokens
        prev = ids[-1]
        for token in self.tokens(ids, max_tokens, temperature, top_p, seed, top_k, cache,
                                 cache_rotation, cache_scores, cache_k, cache_v):
            text = utf8.decode(tok.decode_bytes(prev, token))
            prev = token
            if text:
                yield text
        rest = utf8.decode(b"", final=True)
        if rest:
            yield rest

    def logits(self, tokens):
        """The logits [len(tokens), vocab] of one forward over `tokens` (text or ids)."""
        return self._file.logits(self._ids(tokens))

    def perplexity(self, text, ctx=512, cache="f32", cache_rotation="auto", cache_scores="int8",
                   decode=False, cache_k=None, cache_v=None):
        """Perplexity on `text` (a string, or token ids), windowed as llama.cpp's
        llama-perplexity: chunks of `ctx` tokens, each run on its own (starting with BOS when
        the tokenizer adds one), the predictions of each chunk's second half scored; cache:
        the KV cache's storage, cache_rotation, cache_scores, cache_k and cache_v, as in
        generate(); decode=True
        scores the second half one token at a time through the cache (the decoding kernels, as
        generation runs them) instead of the whole chunk at once. A dict: perplexity, nll (nats
        per token) and its nll_stderr, ctx, chunks, scored, chunk_perplexity (after each
        chunk), seconds, cache_k and cache_v (the storage of each), cache_rotation ("on" or
        "off"), cache_scores, decode."""
        tok = self.tokenizer
        if isinstance(text, str):
            if tok is None:
                raise ValueError("this model has no tokenizer: give the text as token ids")
            ids = tok.encode(text)
        else:
            ids = [int(t) for t in text]
        bos = tok.bos if tok is not None and tok.adds_bos else -1
        return self._file.perplexity(ids, int(ctx), bos, str(cache), _storage(cache_k),
                                     _storage(cache_v), str(cache_rotation), str(cache_scores),
                                     bool(decode))


def _storage(name):
    """A cache_k or cache_v argument as the extension takes it: "" for None (the cache's own)."""
    return "" if name is None else str(name)


def load_llama2c(path, tokenizer=None):
    """The llama2.c model at `path` (.bin); its tokenizer is `tokenizer`, else tokenizer.bin or
    tok<vocab>.bin beside it (a model without one loads, for token-id prompts)."""
    return Model(_qkv._load_model(os.fspath(path), os.fspath(tokenizer or ""), False), os.fspath(path))


def load_checkpoint(path):
    """The checkpoint at `path` written by `qkv train` (.safetensors); a byte-level model gets
    the byte tokenizer."""
    return Model(_qkv._load_checkpoint_file(os.fspath(path)), os.fspath(path))


def load_gguf(path, dequantize=False, matmul="exact"):
    """The Llama-architecture GGUF file at `path` (llama.cpp's format) with its own tokenizer. Its weight
    matrices are computed with in place, in their block formats (Q4_1, Q8_0, …), by generate(),
    logits() and attention_map() alike; dequantize=True makes them fp32 (the memory of an fp32
    model). matmul: "exact" or "int8" (see Model.matmul)."""
    model = Model(_qkv._load_gguf_file(os.fspath(path), bool(dequantize)), os.fspath(path))
    model.matmul = matmul
    return model


class Chat:
    """A conversation with an instruction-tuned GGUF model whose chat template is ChatML
    (SmolLM2, Qwen, …). The keys and values stay cached from turn to turn: each turn runs only
    its new tokens.

        chat = qkv.Chat(qkv.load_gguf(path))
        for piece in chat.stream("What is attention?"):
            print(piece, end="", flush=True)

    system: the system prompt (None: the one the template writes, "" for none); max_reply:
    tokens per answer at most; context: positions for all turns together (0: the model's);
    temperature (0: greedy), top_p, top_k and seed sample as generate() does; cache: the KV
    cache's storage, "f32", "bf16", "f16", "q8_0", "q4_0" or "q4_1", cache_rotation,
    cache_scores, cache_k and cache_v, as in generate().
    """

    def __init__(self, model, system=None, *, max_reply=1024, context=0, temperature=0.7,
                 top_p=0.9, top_k=0, seed=1, cache="f32", cache_rotation="auto",
                 cache_scores="int8", cache_k=None, cache_v=None):
        self.model = model
        if model._file.format != "gguf":
            raise ValueError(f"Chat needs a GGUF model with a chat template; {model.path} is "
                             f"{model._file.format}")
        if system is None:
            system = _qkv._default_system_prompt(model._file.chat_template)
        self.system = str(system)
        self._chat = _qkv._Chat(model._file, self.system, int(max_reply), int(context),
                                float(temperature), float(top_p), int(top_k), int(seed),
                                str(cache), _storage(cache_k), _storage(cache_v),
                                str(cache_rotation), str(cache_scores))
        self.reset()

    def reset(self):
        """Forgets the conversation; the system prompt stays."""
        self._chat.reset()
        self.transcript = [{"role": "system", "content": self.system}] if self.system else []
        """The messages so far: dicts of role and content, the replies as streamed."""
        self.stats = None
        """The last turn's prompt_tokens, reply_tokens, prefill_seconds, decode_seconds and
        finished (False: it stopped at max_reply or was not read to its end)."""

    def add(self, role, content):
        """Puts a message (`role`: "system", "user" or "assistant"; `content`: its text) in the
        conversation — an earlier exchange, a few-shot example — without running the model; the
        next respond() runs it."""
        self._chat.add(str(role), str(content))
        self.transcript.append({"role": str(role), "content": str(content)})

    def respond(self):
        """The assistant's answer to what was added, streamed as pieces of text."""
        return self._stream(self._chat.respond, [])

    def stream(self, user):
        """Adds the user's message and streams the answer as pieces of text. When the turn would
        not fit in the context that is left, raises ValueError and the conversation is as before."""
        return self._stream(lambda on_piece: self._chat.reply(str(user), on_piece),
                            [{"role": "user", "content": str(user)}])

    def reply(self, user):
        """Adds the user's message and returns the whole answer."""
        return "".join(self.stream(user))

    @property
    def tokens(self):
        """Every token id of the conversation so far, as the model reads it."""
        return self._chat.tokens

    @property
    def positions(self):
        """Positions of the context the conversation has used."""
        return self._chat.positions

    @property
    def context(self):
        return self._chat.context

    def _stream(self, run, messages):
        # The model runs in a thread of its own (without the GIL) and hands each token's bytes
        # over a queue, so that the caller reads the answer as it is written. A caller that stops
        # reading stops the model at the next token.
        pieces, stop, outcome = queue.SimpleQueue(), threading.Event(), {}

        def on_piece(data):
            pieces.put(data)
            return not stop.is_set()

        def turn():
            try:
                outcome["stats"] = run(on_piece)
            except BaseException as e:  # raised in the caller's thread
                outcome["error"] = e
            finally:
                pieces.put(None)

        utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # a character may span tokens
        text = []
        worker = threading.Thread(target=turn, daemon=True)
        worker.start()
        try:
            while (data := pieces.get()) is not None:
                piece = utf8.decode(data)
                if piece:
                    text.append(piece)
                    yield piece
            rest = utf8.decode(b"", final=True)
            if rest:
                text.append(rest)
                yield rest
        finally:
            stop.set()
            worker.join()
            while not pieces.empty():  # drawn after the caller stopped reading: kept by the model
                data = pieces.get()
                text.append(utf8.decode(data or b"", final=data is None))
            if "error" not in outcome:
                self.stats = outcome.get("stats")
                self.transcript += messages + [{"role": "assistant", "content": "".join(text)}]
        if "error" in outcome:
            raise outcome["error"]


class Explanation:
    """Every step of attention for a small example, as a learner works it by hand.

    Arrays (one row per query): q, k, v; raw_scores (k_j · q_i); scaled_scores (÷ √d_k);
    masked (True where the causal mask hides key j); exp (e^score, 0 where masked); z (Σ exp);
    weights (exp / z, each row sums to 1); output (Σ_j weights_ij v_j). Also tokens,
    key_tokens, d_k, scale, causal, and the notes on the articles' rounding.
    """

    def __init__(self, doc):
        self.doc = doc
        self.tokens, self.key_tokens = doc["tokens"], doc["key_tokens"]
        self.d_k, self.scale, self.causal = doc["d_k"], doc["scale"], doc["causal"]
        self.convention, self.notes = doc["convention"], doc["notes"]
        self.q, self.k, self.v = (np.array(doc[n], dtype=np.float64) for n in ("q", "k", "v"))
        rows = doc["queries"]
        self.raw_scores = np.array([r["raw_scores"] for r in rows])
        self.scaled_scores = np.array([r["scaled_scores"] for r in rows])
        self.masked = np.array([r["masked"] for r in rows], dtype=bool)
        self.exp = np.array([r["exp"] for r in rows])
        self.z = np.array([r["z"] for r in rows])
        self.weights = np.array([r["weights"] for r in rows])
        self.output = np.array([r["output"] for r in rows])

    def __repr__(self):
        with np.printoptions(precision=3, suppress=True):
            return (f"qkv.Explanation({len(self.tokens)} queries × {len(self.key_tokens)} keys, d_k = "
                    f"{self.d_k}, causal={self.causal})\nweights =\n{self.weights}\noutput =\n{self.output}")


def explain(q=None, k=None, v=None, *, causal=False, tokens=None, key_tokens=None):
    """The worked example of the articles (no arguments: fluffy, blue, creature) or your own
    small q [Tq, d], k [Tk, d], v [Tk, dv] (at most 64 tokens and 64 dims), step by step.
    causal: the causal mask (future scores −inf, weight 0); tokens and key_tokens: labels of
    the queries and of the keys."""
    if q is None and k is None and v is None:
        return Explanation(json.loads(_qkv._worked_example_json(bool(causal))))
    if q is None or k is None or v is None:
        raise ValueError("explain needs all of q, k and v (or none, for the articles' example)")
    doc = {n: np.asarray(a, dtype=np.float64).tolist() for n, a in (("q", q), ("k", k), ("v", v))}
    if tokens is not None:
        doc["tokens"] = list(tokens)
    if key_tokens is not None:
        doc["key_tokens"] = list(key_tokens)
    return Explanation(json.loads(_qkv._explain_json(json.dumps(doc), bool(causal), "explain")))


class AttentionMap:
    """The attention weights of every layer and head of a model on a prompt.

    weights: [layers, heads, T, T] (each row sums to 1; exactly 0 above the diagonal of a
    causal model); tokens: the T tokens as labels; html: the page `qkv viz` writes. In Jupyter
    the object shows that page inline.
    """

    def __init__(self, d):
        self.tokens = d["tokens"]
        self.weights = np.stack(d["weights"])
        self.html = d["html"]

    def save(self, path):
        """Writes the page (`html`) to `path`."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html)

    def _repr_html_(self):
        # The page has its own scripts and styles: inside an iframe they cannot touch the notebook's.
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" style="width:100%;height:640px;'
                f'border:1px solid #ddd" sandbox="allow-scripts"></iframe>')

    def __repr__(self):
        return f"qkv.AttentionMap({self.weights.shape[0]} layers × {self.weights.shape[1]} heads, {len(self.tokens)} tokens)"


def attention_map(model, prompt):
    """Every layer's and head's attention weights of `model` on
    `prompt` (text, or a list of token ids), from the reference kernel: an AttentionMap (at
    most 256 tokens)."""
    if isinstance(prompt, str):
        m = model._file._attention_maps(os.path.basename(model.path), prompt, "")
    else:
        ids = " ".join(str(int(t)) for t in prompt)
        if not ids:
            raise ValueError("the prompt needs at least one token")
        m = model._file._attention_maps(os.path.basename(model.path), "", ids)
    return AttentionMap(m)
