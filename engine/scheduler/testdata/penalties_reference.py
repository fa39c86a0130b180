#!/usr/bin/env python3
"""PyTorch oracle of the logit processing of issue #31 section 3, written as vLLM writes it.

Usage: /usr/bin/python3 penalties_reference.py IN.json OUT.txt   (Debian's python3-torch)

IN.json: a list of cases, each {"logits": [V floats], "prompt": [ids], "output": [ids],
"bias": [[id, bias], ...], "presence": p, "frequency": f, "repetition": r,
"temperature": t, "min_p": m}; every float is a float32 value printed with 9 digits.

For each case, dense over the vocabulary in float32 (vLLM's Sampler: apply_logits_bias, then
apply_penalties from vllm/model_executor/layers/utils.py, then temperature and min-p):
  logits[id] += bias                                    (logit_bias)
  logits[l > 0] /= r, logits[l <= 0] *= r   where id in prompt or output (repetition)
  logits -= frequency * output_counts                   (frequency, OpenAI's definition)
  logits -= presence * (output_counts > 0)              (presence)
  probs = softmax(logits / temperature); keep = probs >= min_p * max(probs)   (min-p)

OUT.txt: per case three lines: "L" and the float32 bit patterns (decimal) of the processed
logits, "K" and the min-p keep mask (0/1 per id), "A" and the argmax (lowest id on ties).
"""
import json
import struct
import sys

import torch


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def process(case):
    f32 = torch.float32
    logits = torch.tensor(case["logits"], dtype=f32).unsqueeze(0)  # [1, V]
    vocab = logits.shape[1]
    # apply_logits_bias: one add per biased id, in float32.
    for token, bias in case["bias"]:
        logits[0, token] += torch.tensor(bias, dtype=f32)

    # apply_penalties: bin counts of the prompt and the output (vLLM pads with vocab_size and
    # drops that column), the masks, then the three penalties in this order.
    def counts(tokens):
        c = torch.zeros((1, vocab + 1), dtype=torch.long)
        if tokens:
            t = torch.tensor([tokens], dtype=torch.long)
            c.scatter_add_(1, t, torch.ones_like(t))
        c = c[:, :vocab]
        return c, c > 0

    _, prompt_mask = counts(case["prompt"])
    output_counts, output_mask = counts(case["output"])
    repetition = torch.tensor([case["repetition"]], dtype=f32).unsqueeze(1).repeat(1, vocab)
    penalties = torch.where(prompt_mask | output_mask, repetition, torch.ones_like(repetition))
    positive = logits > 0
    logits[positive] /= penalties[positive]
    non_positive = logits <= 0
    logits[non_positive] *= penalties[non_positive]
    frequency = torch.tensor([case["frequency"]], dtype=f32).unsqueeze(1)
    presence = torch.tensor([case["presence"]], dtype=f32).unsqueeze(1)
    logits -= frequency * output_counts
    logits -= presence * output_mask

    # Temperature, then min-p as vLLM's MinPLogitsProcessor.
    scaled = logits / torch.tensor(case["temperature"], dtype=f32)
    probs = torch.softmax(scaled, dim=-1)
    keep = probs >= case["min_p"] * probs.amax(dim=-1, keepdim=True)
    row = logits[0]
    best = int(torch.nonzero(row == row.max())[0, 0])  # lowest id among the maxima
    return row.tolist(), keep[0].tolist(), best


def main():
    cases = json.load(open(sys.argv[1]))
    with open(sys.argv[2], "w") as out:
        for case in cases:
            row, keep, best = process(case)
            out.write("L " + " ".join(str(bits(x)) for x in row) + "\n")
            out.write("K " + " ".join("1" if k else "0" for k in keep) + "\n")
            out.write("A %d\n" % best)


if __name__ == "__main__":
    main()
