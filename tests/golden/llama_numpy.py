"""The pieces of a Llama forward the golden scripts share, in NumPy, with llama.cpp's
conventions: RMSNorm, and rotary positions on adjacent pairs."""
import numpy as np


def rmsnorm(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rope(x, pos, theta):
    """x [T, heads, D]: pairs (2j, 2j+1) rotated by pos · θ^(-2j/D)."""
    D = x.shape[-1]
    j = np.arange(D // 2)
    angle = pos[:, None] * theta ** (-2.0 * j / D)
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out
