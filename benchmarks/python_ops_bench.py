"""torch.ops.dapo from Python against the same computations written in PyTorch, same process, same threads:

  policy_loss       dapo.policy_loss (vanilla, dual clip, token-mean) forward + backward at B x T tokens against
                    verl's vanilla loss body with its agg_loss in PyTorch ops
  linear_logprobs   dapo.linear_logprobs(hidden [N, H], weight [V, H], targets) against
                    log_softmax(hidden @ weight.T).gather(...): forward + backward (d hidden, d weight), and forward
                    alone under no_grad (how rollouts and old log-probs are computed)

Each result is checked against the reference before anything is timed. Times: the median of --repeats runs, after one
warm-up. Memory: each variant runs in a child process of its own, and its peak resident memory (VmHWM, reset after the
inputs are made) above what it held before the call is reported; for
forward + backward also above the gradients both must return (d weight alone is V * H * 4 bytes).

    PYTHONPATH=build/python python3 benchmarks/python_ops_bench.py [--tokens 1048576] [--n 2048 --h 1536 --v 151936]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

import dapo


def status_bytes(field):
    """VmRSS (now) or VmHWM (the peak since the last reset) of this process, from /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak():
    """Resets this process's peak resident memory to what it holds now (Linux 4.0 and later); a child inherits its
    parent's peak, so without this the peak would be the parent's."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def verl_vanilla(old_log_prob, log_prob, advantages, mask, low, high, clip_c):
    """verl's vanilla policy loss and token-mean agg_loss in PyTorch ops (the composite a verl user runs today)."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = (-negative_approx_kl * mask).sum() / (mask.sum() + 1e-8)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clipped1 = torch.maximum(losses1, losses2)
    clipfrac = (torch.gt(losses2, losses1).float() * mask).sum() / (mask.sum() + 1e-8)
    losses3 = -advantages * clip_c
    clipped2 = torch.min(losses3, clipped1)
    clipfrac_lower = ((torch.gt(clipped1, losses3) * (advantages < 0)).float() * mask).sum() / (mask.sum() + 1e-8)
    losses = torch.where(advantages < 0, clipped2, clipped1)
    loss = (losses * mask).sum() / mask.sum()
    return loss, (clipfrac, ppo_kl, clipfrac_lower)


def loss_inputs(tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = max(1, tokens // 1024)
    cols = tokens // rows
    old = -torch.rand(rows, cols, generator=g) * 4
    new = old + (torch.rand(rows, cols, generator=g) - 0.5) * 0.6
    advantages = torch.randn(rows, 1, generator=g).expand(rows, cols).contiguous()
    mask = (torch.rand(rows, cols, generator=g) < 0.9).float()
    return old, new, advantages, mask


def run_loss(variant, old, new, advantages, mask):
    log_prob = new.clone().requires_grad_()
    if variant == "dapo":
        loss, metrics = dapo.policy_loss(old, log_prob, advantages, mask, "token-mean", clip_ratio_low=0.2,
                                         clip_ratio_high=0.28, clip_ratio_c=3.0, count_epsilon=0.0)
        values = (metrics["actor/pg_clipfrac"], metrics["actor/ppo_kl"], metrics["actor/pg_clipfrac_lower"])
    else:
        loss, values = verl_vanilla(old, log_prob, advantages, mask, 0.2, 0.28, 3.0)
    loss.backward()
    return loss.detach(), [float(v) for v in values], log_prob.grad


def logprob_inputs(n, h, v, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g)
    weight = torch.randn(v, h, generator=g).mul_(1.0 / h**0.5)  # in place: no transient second copy
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, targets


def run_logprobs(variant, hidden, weight, targets, backward, chunk):
    """hidden and weight: leaves that require grad when backward (made by the caller, outside the measured call, as a
    model's activations and parameters are); their .grad is cleared first."""
    if not backward:
        with torch.no_grad():
            if variant == "dapo":
                return dapo.linear_logprobs(hidden, weight, targets, chunk_size=chunk), None, None
            return torch.log_softmax(hidden @ weight.T, dim=-1).gather(1, targets[:, None])[:, 0], None, None
    hidden.grad = None
    weight.grad = None
    if variant == "dapo":
        log_prob = dapo.linear_logprobs(hidden, weight, targets, chunk_size=chunk)
    else:
        log_prob = torch.log_softmax(hidden @ weight.T, dim=-1).gather(1, targets[:, None])[:, 0]
    log_prob.sum().backward()
    return log_prob.detach(), hidden.grad, weight.grad


def child(args):
    """One variant in this process: check it against the reference (loss: in-process; log-probs: a small slice),
    then time it; prints a JSON line."""
    torch.set_num_threads(args.threads)
    if args.child.startswith("loss"):
        variant = args.child.split(":")[1]  # loss:<variant>:loss
        inputs = loss_inputs(args.tokens)
        call = lambda: run_loss(variant, *inputs)  # noqa: E731
    else:
        _, variant, mode = args.child.split(":")
        hidden, weight, targets = logprob_inputs(args.n, args.h, args.v)
        if mode == "fwdbwd":
            hidden.requires_grad_()
            weight.requires_grad_()
        call = lambda: run_logprobs(variant, hidden, weight, targets, mode == "fwdbwd", args.chunk)  # noqa: E731
    reset_peak()
    before = status_bytes("VmRSS")
    start = time.perf_counter()
    call()  # warm-up; its peak is the call's peak (nothing else runs in this child)
    warm_up = time.perf_counter() - start
    peak = status_bytes("VmHWM") - before
    times = []
    for _ in range(args.repeats if args.child.startswith("loss") else args.logprob_repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    times = times or [warm_up]  # --logprob-repeats 0: the one call, tens of seconds, is the time
    print(json.dumps({"seconds": statistics.median(times), "peak_bytes": peak}))


def check(args):
    """dapo against the reference, before any timing: the loss, its metrics and gradient at full size; the log-probs
    and both gradients on the first 64 rows (the full reference would double the memory of this process)."""
    torch.set_num_threads(args.threads)
    inputs = loss_inputs(args.tokens)
    ours = run_loss("dapo", *inputs)
    theirs = run_loss("verl", *inputs)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(ours[1], theirs[1]):
        assert abs(a - b) <= 1e-5 + 1e-5 * abs(b), (a, b)
    torch.testing.assert_close(ours[2], theirs[2], rtol=1e-4, atol=1e-9)
    hidden, weight, targets = logprob_inputs(args.n, args.h, args.v)
    rows = slice(0, 64)
    leaves = lambda: (hidden[rows].clone().requires_grad_(), weight.clone().requires_grad_())  # noqa: E731
    ours = run_logprobs("dapo", *leaves(), targets[rows], True, args.chunk)
    theirs = run_logprobs("torch", *leaves(), targets[rows], True, args.chunk)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    print("check: dapo equals the PyTorch reference (loss, metrics, d log_prob; log-probs, d hidden, d weight)")


def spawn(args, name):
    command = [sys.executable, os.path.abspath(__file__), "--child", name, "--tokens", str(args.tokens), "--n",
               str(args.n), "--h", str(args.h), "--v", str(args.v), "--chunk", str(args.chunk), "--repeats",
               str(args.repeats), "--logprob-repeats", str(args.logprob_repeats), "--threads", str(args.threads)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1 << 20)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--h", type=int, default=1536)
    parser.add_argument("--v", type=int, default=151936)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of the loss (median)")
    parser.add_argument("--logprob-repeats", type=int, default=1, help="timed runs of the log-probs (tens of s each)")
    parser.add_argument("--pairs", type=int, default=2, help="A B A B: runs of each variant, alternating")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--only", default="loss,fwd,fwdbwd", help="rows to run: loss, fwd, fwdbwd")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{args.threads} threads; dapo ops {dapo.library_path}")
    check(args)
    rows = [
        ("policy_loss fwd+bwd", f"{args.tokens} tokens", "loss:dapo:loss", "loss:verl:loss"),
        (f"linear_logprobs fwd, chunk {args.chunk}", f"N={args.n} H={args.h} V={args.v}", "lp:dapo:fwd", "lp:torch:fwd"),
        (f"linear_logprobs fwd+bwd, chunk {args.chunk}", f"N={args.n} H={args.h} V={args.v}", "lp:dapo:fwdbwd",
         "lp:torch:fwdbwd"),
    ]
    gradient_bytes = (args.v * args.h + args.n * args.h) * 4
    print(f"| op | size | dapo s | PyTorch s | time ratio (PyTorch / dapo, per pair) | dapo peak MB | PyTorch peak MB "
          f"| memory ratio (dapo / PyTorch) |")
    print("|---|---|---:|---:|---|---:|---:|---:|")
    for label, size, ours_name, theirs_name in rows:
        if ours_name.split(":")[-1] not in args.only.split(","):
            continue
        ours, theirs = [], []
        for _ in range(args.pairs):
            ours.append(spawn(args, ours_name))
            theirs.append(spawn(args, theirs_name))
        ratios = [t["seconds"] / o["seconds"] for o, t in zip(ours, theirs)]
        ours_peak = max(o["peak_bytes"] for o in ours)
        theirs_peak = max(t["peak_bytes"] for t in theirs)
        memory = f"{ours_peak / theirs_peak:.3f}"
        if ours_name.endswith("fwdbwd"):
            beyond = (ours_peak - gradient_bytes) / (theirs_peak - gradient_bytes)
            memory += f" ({beyond:.3f} beyond the gradients, {gradient_bytes / 1e6:.0f} MB)"
        print(f"| {label} | {size} | {statistics.median(o['seconds'] for o in ours):.4f} | "
              f"{statistics.median(t['seconds'] for t in theirs):.4f} | "
              f"{', '.join(f'{r:.2f}x' for r in ratios)} | {ours_peak / 1e6:.0f} | {theirs_peak / 1e6:.0f} | {memory} |")


if __name__ == "__main__":
    main()
