"""Generation side by side on this machine's CPU: ours (qwen::generate with its KV cache, through generate_bench
--model DIR --prompts FILE) against Hugging Face transformers' generate() on the same random Qwen2 weights (made and
saved by transformers) and the same prompts, greedy and sampled (temperature 1, no top-k / top-p), EOS suppressed so
every row decodes --new-tokens tokens; float32, the same thread count. vLLM's CPU engine is not installable here
(docs/benchmarks.md says why), so it has no column.

Each side is timed the same way: the median over --repeats of one whole generate() call (after a warm-up);
tokens/s = batch x new tokens / that time. Before the table: ours' greedy tokens against transformers' (rows
identical; a row that differs must first differ where the two tokens' float32 logits are within 1e-4 of the logits'
scale, a tie that summation order decides; anything else fails).

    $(bash scripts/anchors.sh)/bin/python benchmarks/anchors_generate.py \
        --bench build-pip-torch/benchmarks/generate_bench [--shape demo|qwen2.5-0.5b] [--batch 32] [--prompt 128] \
        [--new-tokens 128] [--repeats 2] [--threads 2] [--json PATH]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen2Config

# The shapes of benchmarks/support/shapes.hpp, as config.json files write them.
QWEN25 = dict(vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
              num_key_value_heads=2, tie_word_embeddings=True)
SHAPES = {
    "qwen2.5-0.5b": dict(QWEN25, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "demo": dict(vocab_size=259, hidden_size=64, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
                 tie_word_embeddings=True),
}
FIRST_SPECIAL = 151643  # prompts stay below Qwen2.5's special tokens (and below the vocabulary)


def make_model_dir(shape, path):
    config = Qwen2Config(**SHAPES[shape], use_sliding_window=False, attention_dropout=0.0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    model.save_pretrained(path)
    return model


def hf_generate(model, prompts, new_tokens, sample):
    input_ids = torch.tensor(prompts)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=sample,
                             temperature=1.0 if sample else None, top_k=0 if sample else None,
                             top_p=1.0 if sample else None, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             eos_token_id=None, pad_token_id=0)
    assert out.shape == (len(prompts), len(prompts[0]) + new_tokens), out.shape
    return out[:, len(prompts[0]):]


def hf_timed(model, prompts, new_tokens, sample, repeats):
    hf_generate(model, prompts, new_tokens, sample)  # warm-up
    times, tokens = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = hf_generate(model, prompts, new_tokens, sample)
        times.append(time.perf_counter() - start)
    return statistics.median(times), tokens


def ours_timed(bench, model_dir, prompts_path, new_tokens, sample, repeats, threads, json_path):
    command = [bench, "--device", "cpu", "--dtype", "float32", "--model", model_dir, "--prompts", prompts_path,
               "--new-tokens", str(new_tokens), "--repeats", str(repeats), "--threads", str(threads),
               "--decoding", "sample" if sample else "greedy", "--json", json_path]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"anchors_generate: {' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    with open(json_path) as f:
        record = json.load(f)
    return record["generate_call"]["generate_ms"] / 1e3, torch.tensor(record["tokens"])


def check_greedy(model, prompts, ours, theirs):
    """(identical rows, near-tie rows): a row may differ only after a near-tie of transformers' own logits."""
    identical, near_ties = 0, 0
    for row in range(ours.shape[0]):
        differs = (ours[row] != theirs[row]).nonzero()
        if differs.numel() == 0:
            identical += 1
            continue
        step = int(differs[0])
        prefix = torch.tensor([prompts[row] + theirs[row, :step].tolist()])
        with torch.no_grad():
            logits = model(input_ids=prefix).logits[0, -1].double()
        a, b = int(ours[row, step]), int(theirs[row, step])
        gap, scale = abs(logits[a] - logits[b]).item(), logits.abs().max().item()
        if gap > 1e-4 * scale:
            sys.exit(f"anchors_generate: greedy tokens differ in row {row} at new token {step} ({a} vs {b}), "
                     f"logits {gap:.3g} apart at scale {scale:.3g}: not a tie")
        near_ties += 1
    return identical, near_ties


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default="build-pip-torch/benchmarks/generate_bench")
    parser.add_argument("--shape", default="demo", choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model_dir(args.shape, tmp)
        vocab = min(SHAPES[args.shape]["vocab_size"], FIRST_SPECIAL)
        generator = torch.Generator().manual_seed(1)
        prompts = torch.randint(0, vocab, (args.batch, args.prompt), generator=generator).tolist()
        prompts_path = os.path.join(tmp, "prompts.json")
        with open(prompts_path, "w") as f:
            json.dump({"prompts": prompts}, f)
        rows = {}
        for sample in (False, True):
            name = "sampled" if sample else "greedy"
            ours_s, ours_tokens = ours_timed(args.bench, tmp, prompts_path, args.new_tokens, sample, args.repeats,
                                             args.threads, os.path.join(tmp, f"ours-{name}.json"))
            hf_s, hf_tokens = hf_timed(model, prompts, args.new_tokens, sample, args.repeats)
            rows[name] = (ours_s, hf_s)
            if not sample:
                identical, near_ties = check_greedy(model, prompts, ours_tokens, hf_tokens)
                print(f"anchors_generate: greedy tokens: {identical} of {args.batch} rows identical, {near_ties} "
                      "first differ at a near-tie")
    new = args.batch * args.new_tokens
    print(f"anchors_generate: {args.shape} shape, float32, batch {args.batch} x {args.prompt} prompt tokens -> "
          f"{args.new_tokens} new, {args.threads} threads, median of {args.repeats}; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {platform.machine()}")
    print("| decoding | ours tokens/s | transformers tokens/s | ours / transformers |")
    print("|---|---:|---:|---:|")
    record = {"shape": args.shape, "batch": args.batch, "prompt": args.prompt, "new_tokens": args.new_tokens,
              "threads": args.threads, "torch": torch.__version__, "transformers": transformers.__version__}
    for name, (ours_s, hf_s) in rows.items():
        print(f"| {name} | {new / ours_s:.1f} | {new / hf_s:.1f} | {hf_s / ours_s:.2f}x |")
        record[name] = {"ours_seconds": ours_s, "transformers_seconds": hf_s}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
