"""qkv: transformer attention on the CPU, exact and fast, forward and backward.

    import numpy as np, qkv
    q = k = v = np.random.rand(1, 8, 128, 64).astype(np.float32)   # [batch, heads, seq, dim]
    out = qkv.attention(q, k, v, causal=True)

NumPy arrays and torch tensors are read and written in place (any strides; float32, bfloat16
or float16, sums in float32: see qkv.attention for what the bf16 units round). From
PyTorch, ``qkv.torch`` has an autograd Function and drop-ins for
``torch.nn.functional.scaled_dot_product_attention`` and flash-attn's ``flash_attn_func``.
Models: ``qkv.load_llama2c``, ``qkv.load_checkpoint``, ``qkv.load_gguf``; a conversation with a
chat model: ``qkv.Chat``; learning: ``qkv.explain``,
``qkv.attention_map``. Errors from qkv are ``ValueError`` with qkv's message.
"""
from ._qkv import (Tokenizer, build_commit, compiled_targets, current_target, num_threads,
                   set_num_threads, set_target, supported_targets, version)
from ._attention import attention, attention_backward, attention_plan, dropout_mask
from ._models import (AttentionMap, Chat, Explanation, Model, attention_map, explain, load_checkpoint,
                      load_gguf, load_llama2c, stories260k_path)

__version__ = version()  # CMakeLists.txt's project version, as the library was built
__all__ = [
    "attention", "attention_backward", "attention_plan", "dropout_mask", "Model", "load_llama2c", "load_checkpoint", "load_gguf", "Tokenizer",
    "Chat", "explain", "Explanation", "attention_map", "AttentionMap", "stories260k_path",
    "compiled_targets", "supported_targets", "current_target", "set_target", "num_threads",
    "set_num_threads", "version", "build_commit",
]
