"""Reference cases for the C++ sampler (src/puredrive/decode/sampler.cpp), computed with Hugging Face
transformers' logits processors and OpenAI's documented presence/frequency formula.

The processors run in PureDrive's (vLLM's) order: repetition penalty -> presence/frequency -> temperature
-> min_p -> top_k -> top_p -> softmax. Every case uses a subset of them, so each stage is checked against
the library implementation rather than against our own reading of it.

Usage: /work/venvs/ref/bin/python tools/reference/stats/make_sampler_cases.py
Writes src/puredrive/decode/testdata/hf_sampler_cases.json (read by sampler_test.cpp).
"""

import json
import pathlib

import numpy as np
import torch
from transformers import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

OUT = pathlib.Path(__file__).resolve().parents[3] / "src/puredrive/decode/testdata/hf_sampler_cases.json"


def reference_probs(logits, prompt, output, p):
    scores = torch.tensor(logits, dtype=torch.float32)[None, :]
    ids = torch.tensor([prompt + output], dtype=torch.long)
    if p["repetition_penalty"] != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(p["repetition_penalty"])(ids, scores)
    # OpenAI: mu[j] -= c[j] * alpha_frequency + float(c[j] > 0) * alpha_presence, c = output counts.
    counts = np.bincount(np.array(output, dtype=np.int64), minlength=len(logits))
    scores = scores - torch.tensor(counts * p["frequency_penalty"], dtype=torch.float32)[None, :]
    scores = scores - torch.tensor((counts > 0) * p["presence_penalty"], dtype=torch.float32)[None, :]
    scores = scores.to(torch.float64)  # the warpers below in double, like the C++ sampler
    if p["temperature"] != 1.0:
        scores = TemperatureLogitsWarper(p["temperature"])(ids, scores)
    if p["min_p"] > 0.0:
        scores = MinPLogitsWarper(p["min_p"])(ids, scores)
    if p["top_k"] > 0:
        scores = TopKLogitsWarper(p["top_k"])(ids, scores)
    if p["top_p"] < 1.0:
        scores = TopPLogitsWarper(p["top_p"])(ids, scores)
    return torch.softmax(scores, dim=-1)[0].tolist()


def main():
    rng = np.random.default_rng(20250611)
    cases = []
    for i in range(24):
        vocab = [64, 200][i % 2]
        logits = (rng.standard_normal(vocab) * rng.choice([1.0, 2.5])).astype(np.float32)
        prompt = rng.integers(0, vocab, 10).tolist()
        output = rng.integers(0, vocab, 6).tolist() + [int(rng.integers(0, vocab))] * 2
        params = {
            "temperature": float(rng.choice([0.5, 0.8, 1.0, 1.4])),
            "top_k": int(rng.choice([0, 5, 20])),
            "top_p": float(rng.choice([1.0, 0.9, 0.6])),
            "min_p": float(rng.choice([0.0, 0.0, 0.05])),
            "repetition_penalty": float(rng.choice([1.0, 1.3, 0.85])),
            "presence_penalty": float(rng.choice([0.0, 0.5, -0.4])),
            "frequency_penalty": float(rng.choice([0.0, 0.3])),
        }
        if i < 4:  # penalties and temperature alone, over the whole vocabulary
            params.update(top_k=0, top_p=1.0, min_p=0.0)
        cases.append({
            "logits": [float(f"{x:.9g}") for x in logits],  # 9 digits round-trip a float32
            "prompt": prompt,
            "output": output,
            "params": params,
            "probs": [float(f"{x:.13g}") for x in reference_probs(logits.tolist(), prompt, output, params)],
        })
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"generator": "tools/reference/stats/make_sampler_cases.py", "cases": cases}) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
