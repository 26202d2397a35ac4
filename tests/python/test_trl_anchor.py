"""TRL itself against dapo: the same fixed rollouts (prompts, completions, rewards, old log-probs) through TRL's own
GRPOTrainer (its _generate_and_score_completions for the advantages, masks and token counts, then its _compute_loss)
and through dapo: dapo.trl.grpo_loss (dapo::trl_loss_type, the mapping behind the driver's --loss-type, and the
fused policy loss) on the policy's log-probs, and dapo.trl.FusedLinearGRPOLoss on its last hidden states. Loss and
d loss / d log-probs (and, for the fused module, every parameter's gradient) equal within float32 bounds, for TRL's
loss_type dapo, grpo, bnpo, dr_grpo, cispo and sapo, with epsilon / epsilon_high 0.2 / 0.28,
importance_sampling_level="sequence" (GSPO), beta > 0 (k3 against TRL's reference model), mask_truncated_completions,
delta, gradient accumulation with steps_per_generation, and scale_rewards group / batch / none. The policy is a random
Qwen2 model made by transformers with the Qwen2.5 tokenizer of ../shared (so TRL's pad and EOS ids are Qwen's).

Needs TRL (the anchors' environment, scripts/anchors.sh; the pip-torch leg sets DAPO_REQUIRE_TRL=1 so that its
absence fails there); elsewhere it skips. DAPO_TRL_ROLLOUTS=FILE.json runs other rollouts: an object with
num_generations, prompt_ids [[int]], completion_ids [[int]] (a completion ending in <|im_end|> is finished, any
other is truncated), rewards [float], and optionally old_logp_shift [[float]] (old = the policy's log-prob minus it,
per completion token; default: seeded noise)."""

import copy
import json
import os

import pytest
import torch

from conftest import shared_dir

if os.environ.get("DAPO_REQUIRE_TRL") == "1":
    import trl  # noqa: F401  (the pip-torch leg: a missing TRL fails)
else:
    pytest.importorskip("trl", reason="TRL is not installed (the anchors' environment: scripts/anchors.sh)")

import dapo.trl  # noqa: E402
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

# float32 on both sides, different operation orders: relative bounds on the loss and on gradient norms.
LOSS_RTOL, GRAD_RTOL = 2e-5, 1e-4
SUMMARY = {}
TRL_RESULTS = {}  # (loss_type, variant) -> TRL's loss and parameter gradients, reused by the mixin's test


def tokenizer_dir():
    path = os.path.join(shared_dir(), "fixtures", "tokenizer", "qwen2.5")
    if not os.path.exists(path):
        message = f"{path} not found (the reference data: place shared/ beside the checkout or set DAPO_SHARED_DIR)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def seeded_rollouts(eos, seed=0, prompts=3, num_generations=4, max_completion_length=10):
    """Prompts of 4-9 tokens; completions of 2-10 tokens, about a third truncated (no EOS, the full length); rewards
    on a GSM8K-like scale with one all-equal group (advantage 0 there)."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids, completion_ids, rewards = [], [], []
    for p in range(prompts):
        prompt = torch.randint(0, 150000, (int(torch.randint(4, 10, (1,), generator=g)),), generator=g).tolist()
        for _ in range(num_generations):
            prompt_ids.append(prompt)
            if torch.rand(1, generator=g).item() < 0.35:
                completion_ids.append(torch.randint(0, 150000, (max_completion_length,), generator=g).tolist())
            else:
                length = int(torch.randint(1, max_completion_length, (1,), generator=g))
                completion_ids.append(torch.randint(0, 150000, (length,), generator=g).tolist() + [eos])
            rewards.append(2.0 if p == 2 else float(torch.randint(0, 5, (1,), generator=g)) * 0.625)
    return {"num_generations": num_generations, "prompt_ids": prompt_ids, "completion_ids": completion_ids,
            "rewards": rewards}


def rollouts(eos):
    path = os.environ.get("DAPO_TRL_ROLLOUTS")
    if not path:
        return seeded_rollouts(eos)
    with open(path) as f:
        data = json.load(f)
    for field in ("num_generations", "prompt_ids", "completion_ids", "rewards"):
        if field not in data:
            raise ValueError(f"{path}: no field '{field}'")
    rows = len(data["prompt_ids"])
    if len(data["completion_ids"]) != rows or len(data["rewards"]) != rows or rows % data["num_generations"]:
        raise ValueError(f"{path}: prompt_ids, completion_ids and rewards must have the same length, a multiple of "
                         f"num_generations ({data['num_generations']})")
    return data


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A random Qwen2 policy (hidden 32, 2 layers, GQA 4/2, tied, Qwen2.5's vocabulary) saved for TRL to load."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    model = Qwen2ForCausalLM(config).float()
    path = tmp_path_factory.mktemp("policy")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


# Each case: GRPOConfig fields beyond the common ones. Cases are counted by loss_type and option in the summary.
BASE = {"epsilon": 0.2, "epsilon_high": 0.28}
VARIANTS = {
    "plain": {},
    "sequence": {"importance_sampling_level": "sequence"},
    "beta": {"beta": 0.04},
    "sequence_beta": {"importance_sampling_level": "sequence", "beta": 0.04},
    "mask_truncated": {"mask_truncated_completions": True},
    "scale_batch": {"scale_rewards": "batch"},
    "scale_none": {"scale_rewards": "none"},
    "delta": {"delta": 1.5},
    "accumulation": {"gradient_accumulation_steps": 2, "steps_per_generation": 4},
}
LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo")


def cases():
    for loss_type in LOSS_TYPES:
        for name, fields in VARIANTS.items():
            token_only = loss_type in ("cispo", "sapo")
            if token_only and name in ("sequence", "sequence_beta", "delta"):
                continue  # TRL's cispo and sapo are token-level and have no two-sided clip
            extra = {"epsilon_high": 5.0} if loss_type == "cispo" else {}  # cispo's cap, TRL's recommendation
            yield pytest.param(loss_type, name, {**BASE, **fields, **extra}, id=f"{loss_type}-{name}")


def trl_run(policy_dir, tmp_path, loss_type, fields, data, trainer_class=GRPOTrainer):
    """TRL's GRPOTrainer (or trainer_class) on the fixed rollouts: (trainer, inputs from _generate_and_score_completions, TRL's loss,
    TRL's d loss / d per-token log-probs, TRL's per-token log-probs)."""
    rows = len(data["prompt_ids"])
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    from datasets import Dataset

    config_fields = dict(fields)
    accumulation = config_fields.get("gradient_accumulation_steps", 1)
    # One generation batch of all the rows: per_device_train_batch_size x steps_per_generation of them.
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=rows // config_fields.get("steps_per_generation", 1),
        num_generations=data["num_generations"], max_completion_length=max(map(len, data["completion_ids"])),
        loss_type=loss_type, report_to="none", use_cpu=True, bf16=False, fp16=False, logging_steps=1,
        save_strategy="no", **config_fields,
    )
    prompts = [tokenizer.decode(ids) for ids in data["prompt_ids"]]
    dataset = Dataset.from_dict({"prompt": prompts, "reward": data["rewards"]})

    def fixed_reward(completions, reward, **kwargs):
        return list(reward)

    trainer = trainer_class(model=policy_dir, reward_funcs=fixed_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer)
    trainer.model.train()
    if fields.get("beta", 0.0) != 0.0:  # the reference is the saved policy: move the policy away from it
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for parameter in trainer.model.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=g) * 0.05)
    trainer.current_gradient_accumulation_steps = accumulation

    def fixed_generate(prompt_texts):
        completions = [tokenizer.decode(ids) for ids in data["completion_ids"]]
        return ([list(p) for p in data["prompt_ids"]], [list(c) for c in data["completion_ids"]], None, completions,
                None, {}, None, None)

    trainer._generate = fixed_generate
    inputs = [{"prompt": prompts[i], "reward": data["rewards"][i]} for i in range(rows)]
    with torch.no_grad():
        output = trainer._generate_and_score_completions(inputs)

    captured = {}
    original = trainer._get_per_token_logps_and_entropies

    def capturing(*args, **kwargs):
        logps, entropies, aux = original(*args, **kwargs)
        if logps.requires_grad:
            logps.retain_grad()
            captured["logps"] = logps
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = capturing
    # The old log-probs of an earlier policy (TRL's off-policy case): the current ones shifted per token.
    with torch.no_grad():
        current, _, _ = original(trainer.model, torch.cat([output["prompt_ids"], output["completion_ids"]], 1),
                                 torch.cat([output["prompt_mask"], output["completion_mask"]], 1),
                                 output["completion_ids"].size(1))
    if "old_logp_shift" in data:
        shift = torch.zeros_like(current)
        for row, values in enumerate(data["old_logp_shift"]):
            shift[row, : len(values)] = torch.tensor(values, dtype=current.dtype)
    else:
        shift = torch.randn(current.shape, generator=torch.Generator().manual_seed(2)) * 0.3
    output["old_per_token_logps"] = current - shift
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, output)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return trainer, output, loss.detach(), captured["logps"].grad.detach(), captured["logps"].detach(), grads


def dapo_inputs(trainer, data, fields):
    """What dapo computes itself from the raw rollouts: the mask (truncated rows out where asked), the advantages
    (dapo.trl.advantages), the token count, and the prompt + completion batch (left / right padded as TRL pads)."""
    tokenizer = trainer.processing_class
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows = len(data["prompt_ids"])
    prompt_width = max(map(len, data["prompt_ids"]))
    width = max(map(len, data["completion_ids"]))
    prompt_ids = torch.full((rows, prompt_width), pad)
    prompt_mask = torch.zeros(rows, prompt_width, dtype=torch.long)
    completion_ids = torch.full((rows, width), pad)
    mask = torch.zeros(rows, width)
    for row, (p, c) in enumerate(zip(data["prompt_ids"], data["completion_ids"])):
        prompt_ids[row, prompt_width - len(p):] = torch.tensor(p)
        prompt_mask[row, prompt_width - len(p):] = 1
        completion_ids[row, : len(c)] = torch.tensor(c)
        truncated = c[-1] not in (eos, pad)
        if not (fields.get("mask_truncated_completions") and truncated):
            mask[row, : len(c)] = 1.0
    advantages = dapo.trl.advantages(torch.tensor(data["rewards"], dtype=torch.float32), data["num_generations"],
                                     fields.get("scale_rewards", "group"))
    return prompt_ids, prompt_mask, completion_ids, mask, advantages


def policy_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """log p(completion token) [B, T] and the last hidden states before each completion token [B, T, H]."""
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention = torch.cat([prompt_mask, completion_mask.long()], 1)
    hidden = model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
    width = completion_ids.size(1)
    before = hidden[:, -width - 1 : -1]
    logits = model.lm_head(before)
    return torch.log_softmax(logits.float(), -1).gather(-1, completion_ids[..., None])[..., 0], before


def relative(a, b):
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


@pytest.mark.parametrize("loss_type,variant,fields", list(cases()))
def test_trl_grpo_trainer_loss_equals_dapo(policy_dir, tmp_path, loss_type, variant, fields):
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    data = rollouts(tokenizer.eos_token_id)
    trainer, output, trl_loss, trl_grad, trl_logps, trl_param_grads = trl_run(
        policy_dir, tmp_path, loss_type, fields, data
    )
    TRL_RESULTS[(loss_type, variant)] = (trl_loss, trl_param_grads)
    prompt_ids, prompt_mask, completion_ids, mask, advantages = dapo_inputs(trainer, data, fields)
    # dapo's own inputs are TRL's: ids, mask (mask_truncated_completions), advantages (scale_rewards), token count.
    assert torch.equal(prompt_ids, output["prompt_ids"].cpu())
    assert torch.equal(completion_ids, output["completion_ids"].cpu())
    assert torch.equal(mask, output["completion_mask"].float().cpu())
    torch.testing.assert_close(advantages, output["advantages"].float().cpu(), rtol=1e-5, atol=1e-6)
    assert float(output["num_items_in_batch"]) == float(mask.sum())
    if fields.get("mask_truncated_completions"):
        assert 0 < int((mask.sum(1) == 0).sum()) < mask.shape[0]  # some rows masked out, not all

    model = trainer.model
    old = output["old_per_token_logps"].detach()
    ref = None
    if fields.get("beta", 0.0) != 0.0:
        with torch.no_grad():
            ref, _ = policy_logps(trainer.ref_model, prompt_ids, prompt_mask, completion_ids, mask)
        torch.testing.assert_close(ref * mask, output["ref_per_token_logps"] * mask, rtol=0, atol=1e-5)
    options = dict(
        loss_type=loss_type, epsilon=fields["epsilon"], epsilon_high=fields["epsilon_high"],
        delta=fields.get("delta"), importance_sampling_level=fields.get("importance_sampling_level", "token"),
        max_completion_length=trainer.max_completion_length,
        gradient_accumulation_steps=fields.get("gradient_accumulation_steps", 1),
        steps_per_generation=fields.get("steps_per_generation"), num_items_in_batch=float(mask.sum()),
        beta=fields.get("beta", 0.0), ref_per_token_logps=ref,
    )

    # 1. dapo.trl.grpo_loss on the policy's log-probs: loss and d loss / d log-probs.
    with torch.no_grad():
        logps, _ = policy_logps(model, prompt_ids, prompt_mask, completion_ids, mask)
    torch.testing.assert_close(logps * mask, trl_logps * mask, rtol=0, atol=1e-5)
    leaf = logps.clone().requires_grad_()
    loss, _ = dapo.trl.grpo_loss(leaf, old, advantages, mask, **options)
    loss.backward()
    assert trl_loss.abs().item() > 0
    assert abs(loss.item() - trl_loss.item()) <= LOSS_RTOL * abs(trl_loss.item()) + 1e-7, (loss, trl_loss)
    assert relative(leaf.grad * mask, trl_grad * mask) < GRAD_RTOL
    assert trl_grad.norm() > 0

    # 2. dapo.trl.FusedLinearGRPOLoss (Liger's call shape, TRL's use_liger_kernel) on the last hidden states: loss
    # and every parameter's gradient. Its loss_normalizer is TRL's divisor for dapo and cispo.
    if fields.get("gradient_accumulation_steps", 1) == 1:
        fused = dapo.trl.FusedLinearGRPOLoss(
            beta=options["beta"], epsilon_low=fields["epsilon"], epsilon_high=fields["epsilon_high"],
            loss_type=loss_type, max_completion_length=trainer.max_completion_length,
            importance_sampling_level=options["importance_sampling_level"], delta=fields.get("delta"),
            use_bias_correction_kl=True,  # GRPOConfig's default
        )
        model.zero_grad()
        _, hidden = policy_logps(model, prompt_ids, prompt_mask, completion_ids, mask)
        fused_loss, _ = fused(hidden, model.lm_head.weight, completion_ids, mask, advantages,
                              ref_per_token_logps=ref, old_per_token_logps=old,
                              loss_normalizer=float(mask.sum()))
        fused_loss.backward()
        assert abs(fused_loss.item() - trl_loss.item()) <= LOSS_RTOL * abs(trl_loss.item()) + 1e-7
        for name, p in model.named_parameters():
            if name in trl_param_grads:
                assert relative(p.grad, trl_param_grads[name]) < GRAD_RTOL, name
    SUMMARY.setdefault(loss_type, []).append(variant)


class DapoGRPOTrainer(dapo.trl.GRPOLossMixin, GRPOTrainer):
    """The documented drop-in: TRL's trainer with dapo's loss."""


@pytest.mark.parametrize("loss_type,variant,fields", [
    case for case in cases() if case.values[1] in ("plain", "sequence_beta", "scale_batch", "accumulation")
])
def test_dapo_loss_inside_trl_trainer(policy_dir, tmp_path, loss_type, variant, fields):
    """GRPOTrainer with dapo.trl.GRPOLossMixin: the same loss and parameter gradients as TRL's own on the same
    rollouts (everything else is TRL's: the inputs come from its own _generate_and_score_completions)."""
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    data = rollouts(tokenizer.eos_token_id)
    if (loss_type, variant) in TRL_RESULTS:  # TRL's own run of the same case, above
        trl_loss, trl_grads = TRL_RESULTS[(loss_type, variant)]
    else:
        _, _, trl_loss, _, _, trl_grads = trl_run(policy_dir, tmp_path / "trl", loss_type, fields, data)
    _, _, ours, _, _, our_grads = trl_run(policy_dir, tmp_path / "dapo", loss_type, fields, data,
                                          trainer_class=DapoGRPOTrainer)
    assert abs(ours.item() - trl_loss.item()) <= LOSS_RTOL * abs(trl_loss.item()) + 1e-7, (ours, trl_loss)
    assert set(our_grads) == set(trl_grads)
    for name, grad in trl_grads.items():
        assert relative(our_grads[name], grad) < GRAD_RTOL, name
    SUMMARY.setdefault("mixin", []).append(f"{loss_type}-{variant}")


def test_dapo_loss_mixin_refuses_what_it_does_not_compute(policy_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    data = rollouts(tokenizer.eos_token_id)
    with pytest.raises(ValueError, match="top_entropy_quantile < 1 is not computed by dapo's loss"):
        trl_run(policy_dir, tmp_path, "dapo", {**BASE, "top_entropy_quantile": 0.5}, data,
                trainer_class=DapoGRPOTrainer)


def test_trl_anchor_summary():
    """Counts the cases above by loss_type and option (they run first, in file order)."""
    for loss_type in LOSS_TYPES:
        print(f"trl anchor: loss_type {loss_type}: {len(SUMMARY.get(loss_type, []))} cases equal "
              f"({', '.join(SUMMARY.get(loss_type, []))})")
    for variant in VARIANTS:
        count = sum(variant in v for k, v in SUMMARY.items() if k != "mixin")
        print(f"trl anchor: option {variant}: {count} loss types equal")
    print(f"trl anchor: GRPOTrainer with dapo.trl.GRPOLossMixin: {len(SUMMARY.get('mixin', []))} cases equal "
          f"({', '.join(SUMMARY.get('mixin', []))})")
    assert sum(map(len, SUMMARY.values())) > 0
