"""The loss of a DAPO step as TRL computes it against dapo's, same process, same threads, same inputs: TRL's own
GRPOTrainer._compute_loss (its code, with the model's forward replaced by the given per-token log-probs, so that only
the loss runs: ratios, clip, aggregation, and the metrics TRL logs) against dapo.trl.grpo_loss (the fused kernel),
forward + backward (d loss / d log-probs) at B x T tokens, loss_type "dapo" with epsilon 0.2 / 0.28.

Both results are compared before anything is timed (loss within 1e-5 relative, gradient 1e-4). Times: A B A B pairs,
each the median of --repeats runs after a warm-up; the ratio per pair. Needs the anchors' environment
(scripts/anchors.sh) and torch.ops.dapo built against its torch (scripts/pip-torch.sh or scripts/python-build.sh):

    $(bash scripts/anchors.sh)/bin/python benchmarks/trl_loss_bench.py --package build-pip-torch/python
"""

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import torch


def shared_tokenizer():
    shared = os.environ.get("DAPO_SHARED_DIR") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared")
    return os.path.join(shared, "fixtures", "tokenizer", "qwen2.5")


def make_trainer(tmp):
    from datasets import Dataset
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(shared_tokenizer())
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    args = GRPOConfig(output_dir=tmp, per_device_train_batch_size=4, num_generations=4, loss_type="dapo",
                      epsilon=0.2, epsilon_high=0.28, beta=0.0, report_to="none", use_cpu=True, save_strategy="no")
    dataset = Dataset.from_dict({"prompt": ["a"] * 4})
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                          train_dataset=dataset, processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def inputs(rows, cols, seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(rows, cols, generator=g) * 3.0
    old = logp + torch.randn(rows, cols, generator=g) * 0.2
    lengths = torch.randint(cols // 4, cols + 1, (rows,), generator=g)
    mask = (torch.arange(cols)[None, :] < lengths[:, None]).long()
    advantages = torch.randn(rows, generator=g)
    return logp, old, mask, advantages


def trl_step(trainer, logp, old, mask, advantages):
    leaf = logp.clone().requires_grad_()
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (leaf, torch.zeros_like(logp), None)
    rows, cols = logp.shape
    batch = {"prompt_ids": torch.zeros(rows, 1, dtype=torch.long), "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
             "completion_ids": torch.zeros(rows, cols, dtype=torch.long), "completion_mask": mask,
             "advantages": advantages, "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    return loss.detach(), leaf.grad


def dapo_step(trl_module, logp, old, mask, advantages):
    leaf = logp.clone().requires_grad_()
    loss, _ = trl_module.grpo_loss(leaf, old, advantages, mask, loss_type="dapo", epsilon=0.2, epsilon_high=0.28,
                                   num_items_in_batch=float(mask.sum()))
    loss.backward()
    return loss.detach(), leaf.grad


def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--package", default="build-pip-torch/python", help="the folder holding the dapo package")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, args.package)
    import dapo.trl
    import trl

    logp, old, mask, advantages = inputs(args.rows, args.cols)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(tmp)
        trl_loss, trl_grad = trl_step(trainer, logp, old, mask, advantages)
        ours, our_grad = dapo_step(dapo.trl, logp, old, mask, advantages)
        loss_error = abs(ours.item() - trl_loss.item()) / abs(trl_loss.item())
        # A ratio exactly at a clip bound (float32) is a tie of TRL's torch.min, whose gradient goes half to each
        # side; dapo gives it to the unclipped term (docs/algorithm.md). Such tokens are compared apart: counted.
        ratio = torch.exp(logp - old)
        tie = ((ratio == torch.tensor(1 - 0.2)) | (ratio == torch.tensor(1 + 0.28))) & (mask > 0)
        grad_error = ((our_grad - trl_grad)[~tie].norm() / trl_grad[~tie].norm()).item()
        if loss_error > 1e-5 or grad_error > 1e-4:
            sys.exit(f"trl_loss_bench: results differ: loss {loss_error:.2e}, gradient {grad_error:.2e} relative")
        print(f"trl_loss_bench: {args.rows} x {args.cols} = {args.rows * args.cols} slots, {int(mask.sum())} tokens; "
              f"torch {torch.__version__}, trl {trl.__version__}, {args.threads} threads, {platform.processor() or platform.machine()}; "
              f"results equal (loss {loss_error:.1e}, gradient {grad_error:.1e} relative, {int(tie.sum())} tokens at a "
              "clip bound apart)")
        ratios = []
        for pair in range(args.pairs):
            t_trl = timed(lambda: trl_step(trainer, logp, old, mask, advantages), args.repeats)
            t_dapo = timed(lambda: dapo_step(dapo.trl, logp, old, mask, advantages), args.repeats)
            ratios.append(t_trl / t_dapo)
            print(f"pair {pair + 1}: TRL _compute_loss {t_trl * 1e3:.1f} ms, dapo.trl.grpo_loss {t_dapo * 1e3:.1f} ms, "
                  f"{t_trl / t_dapo:.2f}x")
        print(f"trl_loss_bench: dapo {statistics.median(ratios):.2f}x faster than TRL's loss (median of {args.pairs} "
              "pairs), forward + backward")


if __name__ == "__main__":
    main()
