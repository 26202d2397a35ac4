"""A DAPO step side by side on this machine's CPU: TRL's GRPOTrainer (its own generation with transformers'
generate()) against `qwen_gsm8k train`, on the same model directory (a random Qwen2 of --shape made and saved by
transformers, with Qwen2.5's tokenizer), the same GSM8K prompts (the first --prompts questions of the training file,
as chat prompts with the seed's system prompt), the same G, max new tokens, sampling (temperature 1, no top-k / top-p)
and mini-batching (the step's prompts x G rows in one micro-batch, one optimizer step, DAPO's clip 0.2 / 0.28,
TRL's loss_type "dapo" = token-mean, no KL, no dynamic sampling). vLLM's CPU engine is not installable here
(docs/benchmarks.md), so TRL generates with transformers.

TRL runs twice: matched to ours' arithmetic (bf16=False, gradient_checkpointing=False: float32, every activation
kept) and at TRL 1.16's own defaults (bf16 autocast, gradient checkpointing), what a user who sets nothing runs.

Each side runs --steps steps; the last one's wall time is reported, split into generation and update:
  TRL:  generation = _generate_and_score_completions (generate, rewards, advantages; old log-probs are not computed
        at TRL's defaults), update = the rest of the step (the forward with log-probs, the loss, backward, optimizer)
  ours: timing_s/gen (generation) and timing_s/update_actor (old log-probs + the update) of metrics.jsonl; the step
        is timing_s/step (also rewards and bookkeeping)
With random weights almost no row stops early, so both generate --max-new-tokens tokens per row.

    $(bash scripts/anchors.sh)/bin/python benchmarks/anchors_step.py \
        --qwen build-pip-torch/examples/qwen_gsm8k/qwen_gsm8k [--shape small] [--prompts 8] [--rollout-n 4] \
        [--max-new-tokens 128] [--steps 2] [--threads 2] [--json PATH]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
import transformers
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, TrainerCallback

SYSTEM_PROMPT = "\n按照如下格式回答问题：\n<think>\n你的思考过程\n</think>\n<answer>\n你的回答\n</answer>\n"  # the seed's
QWEN25 = dict(vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, num_key_value_heads=2,
              tie_word_embeddings=True, eos_token_id=151645)
SHAPES = {  # benchmarks/support/shapes.hpp
    "small": dict(QWEN25, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                  rope_theta=10000.0, max_position_embeddings=4096),
    "qwen2.5-0.5b": dict(QWEN25, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         rope_theta=1000000.0),
}


def shared_dir():
    return os.environ.get("DAPO_SHARED_DIR") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared")


def make_model_dir(shape, path):
    config = Qwen2Config(**SHAPES[shape], use_sliding_window=False, attention_dropout=0.0)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).float().save_pretrained(path)
    tokenizer_dir = os.path.join(shared_dir(), "fixtures", "tokenizer", "qwen2.5")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), path)


def first_questions(count):
    path = os.path.join(shared_dir(), "data", "gsm8k", "train.jsonl")
    with open(path) as f:
        lines = [json.loads(line) for _, line in zip(range(count), f)]
    return lines, path


class StepTimes(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()
        self.generation = 0.0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append((time.perf_counter() - self.start, self.generation))


def run_trl(model_dir, problems, args, tmp, defaults):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": p["question"]}]
               for p in problems]
    dataset = Dataset.from_dict({"prompt": prompts})
    config = GRPOConfig(
        output_dir=tmp, per_device_train_batch_size=len(problems) * args.rollout_n, num_generations=args.rollout_n,
        gradient_accumulation_steps=1, max_completion_length=args.max_new_tokens, max_steps=args.steps,
        learning_rate=1e-6, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0, temperature=1.0, top_k=0,
        top_p=1.0, report_to="none", use_cpu=True, save_strategy="no", logging_steps=1, dataloader_num_workers=0,
        seed=0, shuffle_dataset=False,
        # TRL 1.16's defaults train under bf16 autocast with gradient checkpointing; matched: ours' arithmetic
        # (float32, every activation kept).
        **({} if defaults else dict(bf16=False, gradient_checkpointing=False)),
    )
    times = StepTimes()
    trainer = GRPOTrainer(model=model_dir, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[times])
    original = trainer._generate_and_score_completions

    def timed(*a, **k):
        start = time.perf_counter()
        out = original(*a, **k)
        times.generation += time.perf_counter() - start
        return out

    trainer._generate_and_score_completions = timed
    trainer.train()
    step, generation = times.steps[-1]
    return {"step_s": step, "gen_s": generation, "update_s": step - generation, "steps": times.steps}


def run_ours(qwen, model_dir, train_path, args, tmp):
    out = os.path.join(tmp, "run")
    command = [qwen, "--threads", str(args.threads), "train", "--model", model_dir, "--train", train_path, "--test", train_path, "--output", out,
               "--steps", str(args.steps), "--train-batch-size", str(args.prompts), "--ppo-mini-batch-size",
               str(args.prompts), "--rollout-n", str(args.rollout_n), "--max-new-tokens", str(args.max_new_tokens),
               "--no-dynamic-sampling", "--eval-every", "0", "--lr", "1e-6", "--temperature", "1.0", "--top-k", "0",
               "--top-p", "1.0", "--loss-type", "dapo", "--clip-ratio-low", "0.2", "--clip-ratio-high", "0.28",
               "--logger", "jsonl", "--log-rollouts", "0", "--seed", "0", "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"anchors_step: {' '.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    last = rows[-1]
    return {"step_s": last["timing_s/step"], "gen_s": last["timing_s/gen"], "update_s": last["timing_s/update_actor"],
            "steps": [(r["timing_s/step"], r["timing_s/gen"]) for r in rows]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qwen", default="build-pip-torch/examples/qwen_gsm8k/qwen_gsm8k")
    parser.add_argument("--shape", default="small", choices=sorted(SHAPES))
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--rollout-n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    problems, train_path = first_questions(args.prompts)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        make_model_dir(args.shape, model_dir)
        subset = os.path.join(tmp, "train.jsonl")
        with open(subset, "w") as f:
            for p in problems:
                f.write(json.dumps(p) + "\n")
        ours = run_ours(args.qwen, model_dir, subset, args, tmp)
        matched = run_trl(model_dir, problems, args, os.path.join(tmp, "trl"), defaults=False)
        defaults = run_trl(model_dir, problems, args, os.path.join(tmp, "trl-defaults"), defaults=True)
    print(f"anchors_step: {args.shape} shape, {args.prompts} GSM8K prompts x G = {args.rollout_n}, "
          f"{args.max_new_tokens} new tokens, step {args.steps} of {args.steps}, {args.threads} threads; torch "
          f"{torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}")
    print("| part | ours (s) | TRL float32 (s) | TRL / ours | TRL's defaults: bf16, checkpointing (s) | TRL / ours |")
    print("|---|---:|---:|---:|---:|---:|")
    for part, key in (("generation", "gen_s"), ("update", "update_s"), ("whole step", "step_s")):
        print(f"| {part} | {ours[key]:.2f} | {matched[key]:.2f} | {matched[key] / ours[key]:.2f}x | "
              f"{defaults[key]:.2f} | {defaults[key] / ours[key]:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "ours": ours, "trl": matched, "trl_defaults": defaults}, f, indent=1)


if __name__ == "__main__":
    main()
