#!/usr/bin/env python3
"""Would the chunked GDN prefill keep its tolerances on bf16 tensor cores? A NumPy model, no GPU.

The CUDA prefill (src/puredrive/backend/cuda/gdn_prefill*.cu) computes the chunked gated delta rule in f32 on
the CUDA cores. Tensor cores take bf16 operands; f32 operands can enter as hi + lo pairs (hi = bf16(x),
lo = bf16(x - hi)), a product as hi*hi + hi*lo + lo*hi (three products) or with lo*lo too (four), summed in
f32. This models the chunked form (64-row chunks, docs/spec/qwen3_5_moe.md §5) with the three products that
involve the running state S (v' = U - W S, o = (q e^G) S + P v', S <- e^G_last S + K'^T v') done that way,
everything else in f32, and prints the max relative error (max |x - ref| / max |ref|) of the outputs and the
final state against the recurrence in f64, on the shapes of tests/cuda/cuda_gdn_test.cpp. The tests allow
1e-4 against the recurrence and 5e-5 against the CPU's chunked form.

Run with the reference tools' venv (tools/reference/setup.sh; it pins numpy):
    tools/reference/.venv/bin/python bench/gdn_split_precision.py
"""
import numpy as np

CHUNK = 64
rng = np.random.default_rng(1)


def to_bf16(x):
    """Round float32 to bfloat16 (nearest, ties to even), returned as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def split(x):
    x = np.asarray(x, dtype=np.float32)
    hi = to_bf16(x)
    return hi, to_bf16(x - hi)


def product(a, b, mode):
    if mode == "f32":
        return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float32)
    ah, al = split(a)
    bh, bl = split(b)
    r = ah.astype(np.float64) @ bh + ah.astype(np.float64) @ bl + al.astype(np.float64) @ bh
    if mode == "bf16 x4":
        r += al.astype(np.float64) @ bl
    return r.astype(np.float32)


def make_case(rows, dk, dv, decay):
    q = rng.standard_normal((rows, dk))
    k = rng.standard_normal((rows, dk))
    v = rng.standard_normal((rows, dv))
    q /= np.linalg.norm(q, axis=1, keepdims=True) * np.sqrt(dk)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal(rows)))
    g = -decay * np.log1p(np.exp(rng.standard_normal(rows)))  # log decays <= 0
    return q, k, v, beta, g


def recurrence(q, k, v, beta, g):
    s = np.zeros((k.shape[1], v.shape[1]))
    out = np.zeros((k.shape[0], v.shape[1]))
    for t in range(k.shape[0]):
        s = np.exp(g[t]) * s
        s = s + np.outer(k[t], beta[t] * (v[t] - s.T @ k[t]))
        out[t] = s.T @ q[t]
    return out, s


def chunked(q, k, v, beta, g, mode):
    f = np.float32
    s = np.zeros((k.shape[1], v.shape[1]), f)
    out = np.zeros((k.shape[0], v.shape[1]), f)
    for c0 in range(0, k.shape[0], CHUNK):
        rows = slice(c0, min(k.shape[0], c0 + CHUNK))
        kc, qc, vc, bc = (x[rows].astype(f) for x in (k, q, v, beta))
        big_g = np.cumsum(g[rows]).astype(f)
        decay = np.exp(np.minimum(big_g[:, None] - big_g[None, :], 0.0)).astype(f)
        n = np.tril(bc[:, None] * (kc @ kc.T) * decay, -1).astype(f)
        p = np.tril((qc @ kc.T) * decay).astype(f)
        inv = np.linalg.inv(np.eye(len(bc)) + n).astype(f)  # I + T = (I + N)^-1
        u = (inv @ (bc[:, None] * vc)).astype(f)
        w = (inv @ ((bc * np.exp(big_g))[:, None] * kc)).astype(f)
        v_new = (u - product(w, s, mode)).astype(f)
        out[rows] = (product(qc * np.exp(big_g)[:, None], s, mode) + product(p, v_new, mode)).astype(f)
        k_last = (kc * np.exp(big_g[-1] - big_g)[:, None]).astype(f)
        s = (np.exp(big_g[-1]) * s + product(k_last.T, v_new, mode)).astype(f)
    return out, s


def rel(x, ref):
    return np.abs(x - ref).max() / np.abs(ref).max()


SHAPES = [  # rows, Dk, Dv, decay scale (cuda_gdn_test's shapes; 1100 rows cross a segment)
    (150, 16, 16, 1.0), (150, 16, 16, 0.01), (150, 32, 40, 0.02), (150, 64, 64, 8.0), (150, 128, 32, 0.05),
    (150, 128, 128, 0.05), (1100, 128, 128, 0.05), (150, 256, 72, 0.02)]

print("rows Dk Dv decay | " + " | ".join(f"{m}: outputs, state" for m in ("f32", "bf16 x3", "bf16 x4")))
for shape in SHAPES:
    case = make_case(*shape)
    ref_out, ref_state = recurrence(*case)
    cells = []
    for mode in ("f32", "bf16 x3", "bf16 x4"):
        o, s = chunked(*case, mode)
        cells.append(f"{rel(o, ref_out):.1e}, {rel(s, ref_state):.1e}")
    print(" ".join(str(x) for x in shape) + " | " + " | ".join(cells))
