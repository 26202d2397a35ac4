#!/usr/bin/env python3
"""Hugging Face transformers' generate() at the settings of generate_bench, for the ratio in docs/benchmarks.md:
random weights of a named shape, greedy, every sequence runs the full length (EOS suppressed), timed the same way:
median over repeats of generate with N new tokens and with 1 (prefill and first token), decode ms per step =
(t_N - t_1) / (N - 1). One JSON object on stdout (and in --json).

  transformers_generate.py [--shape qwen2.5-1.5b] [--dtype bfloat16] [--batch 64] [--prompt 256] [--new-tokens 128]
                           [--repeats 3] [--json PATH]

Runs on the GPU machine (scripts/device-check.sh); it needs transformers, which Debian does not package.
"""
import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen2Config

# The shapes of benchmarks/support/shapes.hpp, as Hub config.json files write them.
SHAPES = {
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, tie_word_embeddings=True),
}


def make_model(shape, dtype, device):
    config = Qwen2Config.from_dict({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "vocab_size": 151936,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "use_sliding_window": False,
        "sliding_window": None, "attention_dropout": 0.0, **SHAPES[shape],
    })
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)  # initialised in the target dtype, on the GPU: seconds, not minutes
    except (TypeError, RuntimeError):
        pass  # a PyTorch that refuses it: initialised in float32 on the GPU, then cast below
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    finally:
        torch.set_default_dtype(previous)
    return model.to(device, dtype).eval()


def timed_generate(model, input_ids, new_tokens):
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    assert out.shape[1] == input_ids.shape[1] + new_tokens, out.shape
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("transformers_generate.py: no CUDA device")
    dtype = getattr(torch, args.dtype)
    model = make_model(args.shape, dtype, "cuda")
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, 151643, (args.batch, args.prompt), generator=generator).cuda()

    timed_generate(model, input_ids, args.new_tokens)  # warm-up (kernels, allocator)
    full, first = [], []
    for _ in range(args.repeats):
        full.append(timed_generate(model, input_ids, args.new_tokens))
        first.append(timed_generate(model, input_ids, 1))
    t_full, t_first = statistics.median(full), statistics.median(first)
    record = {
        "benchmark": "transformers generate",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "shape": args.shape,
        "dtype": args.dtype,
        "batch": args.batch,
        "prompt": args.prompt,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "attention": "sdpa",
        "parameters": sum(p.numel() for p in model.parameters()),
        "seconds": t_full,
        "prefill_ms": t_first * 1e3,
        "decode_ms_per_step": (t_full - t_first) / max(args.new_tokens - 1, 1) * 1e3,
        "tokens_per_second": args.batch * args.new_tokens / t_full,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
    }
    text = json.dumps(record)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
