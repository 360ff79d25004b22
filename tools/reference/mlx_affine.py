"""MLX affine quantization (mode "affine"), written from the format description in spec §9.2.

- Groups of `group_size` consecutive elements along the last (input) dim; one scale s and bias b per group.
- Codes q in [0, 2^bits - 1]; dequantised w = s * q + b.
- The codes of a row form one little-endian bit stream: code j occupies bits [j*bits, (j+1)*bits), bit 0 being the
  least significant bit of the first uint32 word. Packed row length = in_dim * bits / 32 words.

Scales and biases are rounded to bfloat16 (what an MLX bf16 model stores) before the codes are chosen, so that the
stored (s, b, q) triple is exactly what the dequantised reference uses.
"""

from __future__ import annotations

import numpy as np
import torch


def to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest even), returned as float32."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).float().numpy()


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """codes: integer array [..., n] with values < 2^bits -> uint32 [..., n*bits/32]."""
    n = codes.shape[-1]
    if (n * bits) % 32:
        raise ValueError(f"row of {n} codes x {bits} bits is not a whole number of uint32 words")
    c = codes.astype(np.uint64)
    stream = (c[..., None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)  # [..., n, bits], LSB first
    stream = stream.reshape(*codes.shape[:-1], n * bits // 32, 32)
    words = (stream << np.arange(32, dtype=np.uint64)).sum(axis=-1)
    return words.astype(np.uint32)


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint32 [..., w] -> codes uint32 [..., w*32/bits]."""
    w = packed.shape[-1]
    stream = (packed.astype(np.uint64)[..., None] >> np.arange(32, dtype=np.uint64)) & np.uint64(1)
    stream = stream.reshape(*packed.shape[:-1], w * 32 // bits, bits)
    codes = (stream << np.arange(bits, dtype=np.uint64)).sum(axis=-1)
    return codes.astype(np.uint32)


def quantize(w: np.ndarray, bits: int, group_size: int):
    """w: float32 [..., out, in]. Returns (packed uint32, scales f32 (bf16 values), biases f32 (bf16 values))."""
    in_dim = w.shape[-1]
    if in_dim % group_size:
        raise ValueError(f"input dim {in_dim} is not a multiple of group size {group_size}")
    levels = (1 << bits) - 1
    g = w.astype(np.float32).reshape(*w.shape[:-1], in_dim // group_size, group_size)
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    scales = to_bf16((hi - lo) / np.float32(levels))
    biases = to_bf16(lo)
    if np.any(scales <= 0):
        raise ValueError("degenerate (constant) quantization group")
    q = np.rint((g - biases[..., None]) / scales[..., None])
    q = np.clip(q, 0, levels).astype(np.uint32).reshape(w.shape)
    return pack(q, bits), scales.astype(np.float32), biases.astype(np.float32)


def dequantize(packed: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int, group_size: int) -> np.ndarray:
    """float32 w = scale * q + bias, computed in float32 (s * q is exact for bf16 scales and q < 2^8)."""
    q = unpack(packed, bits).astype(np.float32)
    g = q.reshape(*q.shape[:-1], q.shape[-1] // group_size, group_size)
    w = scales.astype(np.float32)[..., None] * g + biases.astype(np.float32)[..., None]
    return w.reshape(q.shape).astype(np.float32)


def dequantize_slow(packed: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int, group_size: int):
    """Independent decoder for checking: each row as one little-endian big integer."""
    rows = packed.reshape(-1, packed.shape[-1])
    n = packed.shape[-1] * 32 // bits
    mask = (1 << bits) - 1
    s = scales.reshape(-1, scales.shape[-1]).astype(np.float32)
    b = biases.reshape(-1, biases.shape[-1]).astype(np.float32)
    out = np.empty((rows.shape[0], n), dtype=np.float32)
    for r in range(rows.shape[0]):
        big = int.from_bytes(rows[r].astype("<u4").tobytes(), "little")
        codes = np.array([(big >> (j * bits)) & mask for j in range(n)], dtype=np.float32)
        gi = np.arange(n) // group_size
        out[r] = s[r, gi] * codes + b[r, gi]
    return out.reshape(*packed.shape[:-1], n)
