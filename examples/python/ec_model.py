"""The stand-in encoder of the Python 1E1PD example: deterministic, cheap,
shaped like Qwen2.5-VL's vision encoder output.

An image is W x H x 3 uint8 pixels drawn from a seed; its mm_hash is the
sha256 of its bytes (as vLLM's); the encoder makes ceil(W/28) * ceil(H/28)
tokens (650 for 700x728) of HIDDEN bf16 values each, from per-patch
statistics and fixed weights.  Only element-wise numpy operations and
pairwise sums are used, so every process computes the same bits: the
consumer checks what it loads against its own recomputation.
"""

import hashlib
import math

import numpy as np
import torch

PATCH = 28  # 14x14 ViT patches merged 2x2
HIDDEN = 2048  # Qwen2.5-VL-3B


def image(seed, w, h):
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def mm_hash(img):
    return hashlib.sha256(img.tobytes()).hexdigest()


def tokens(w, h):
    return math.ceil(w / PATCH) * math.ceil(h / PATCH)


def encode(img, hidden=HIDDEN):
    """[tokens, hidden] torch.bfloat16 embedding of img."""
    h, w, _ = img.shape
    th, tw = math.ceil(h / PATCH), math.ceil(w / PATCH)
    pad = np.zeros((th * PATCH, tw * PATCH, 3), np.float32)
    pad[:h, :w] = img
    patches = pad.reshape(th, PATCH, tw, PATCH, 3).transpose(0, 2, 1, 3, 4).reshape(th * tw, -1)
    mean = patches.mean(axis=1, keepdims=True) / 255.0
    std = patches.std(axis=1, keepdims=True) / 255.0
    rng = np.random.default_rng(1234)  # fixed "weights"
    w1 = rng.standard_normal((1, hidden)).astype(np.float32)
    w2 = rng.standard_normal((1, hidden)).astype(np.float32)
    pos = np.arange(th * tw, dtype=np.float32)[:, None] * np.float32(0.01)
    emb = mean * w1 + std * w2 + np.sin(pos + np.arange(hidden, dtype=np.float32)[None, :])
    return torch.from_numpy(emb.astype(np.float32)).to(torch.bfloat16)
