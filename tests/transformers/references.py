#!/usr/bin/env python3
"""The transformers leg's references, made by Hugging Face transformers, tokenizers and Jinja2 themselves (run in the
Debian sid root by scripts/transformers-check.sh; the C++ tests of this folder and tests/qwen/model_test.cpp read
them). Nothing here compares: the C++ side does, except for what only transformers can see (loading info).

  references.py models OUT        OUT/drift (tests/fixtures/transformers_golden.py new, afresh), OUT/configs/<name>
                                  (models made and saved by transformers in several configurations, each with its
                                  expected.json), OUT/generation.json (generate() on them), OUT/sampling_cases.json
                                  (the logits processors), OUT/initial (a random Qwen2.5-vocabulary model with the
                                  tokenizer, for our trainer to start from), OUT/tokenizer_cases.json,
                                  OUT/chat_cases.json
  references.py checkpoints OUT DIR... [--generate DIR --generate-tokens N]
                                  transformers loads each checkpoint our trainer wrote (no missing, unexpected or
                                  mismatched keys: checked here), its tokenizer, chat template, generation config and
                                  logits on a left-padded batch: OUT/checkpoints.json and OUT/checkpoint-<k>.safetensors;
                                  with --generate, generate() on that checkpoint for GSM8K conversations:
                                  OUT/generate_input.jsonl (for `qwen_gsm8k generate`) and OUT/generate.json

Options of `models`: --strings N (tokenizer strings, default 20000), --conversations N (default 500), --seed S (of
the generated strings and conversations; default: DAPO_FUZZ_SEED or a fresh one, printed, so that every run tries
new inputs and a failure can be repeated).
"""
import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2Config

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "fixtures"))
import transformers_golden as golden  # noqa: E402

SHARED = Path(os.environ.get("DAPO_SHARED_DIR", HERE.parent.parent.parent / "shared"))
TOKENIZER_DIR = SHARED / "fixtures" / "tokenizer" / "qwen2.5"

# The configurations transformers makes and saves for ours to load: tied and untied embeddings, float32 and bfloat16
# on disk, multi-head, grouped and multi-query attention, sharded with max_shard_size, and the config.json layouts of
# transformers 5 (rope_parameters, as save_pretrained writes it) and 4.x (a top-level rope_theta, rewritten here).
BASE = dict(golden.TINY_CONFIG)
CONFIGS = {
    "tied-mha-f32": dict(tie_word_embeddings=True, num_key_value_heads=4),
    "untied-gqa-bf16": dict(tie_word_embeddings=False, num_key_value_heads=2, dtype="bfloat16"),
    "tied-mqa-sharded": dict(tie_word_embeddings=True, num_key_value_heads=1, max_shard_size="40KB"),
    "untied-gqa-4x-config": dict(
        tie_word_embeddings=False, num_key_value_heads=2, num_hidden_layers=3, hidden_size=96,
        num_attention_heads=6, intermediate_size=160, rope_theta=10000.0, rms_norm_eps=1e-5, layout="4.x",
    ),
    "untied-mha-bf16-sharded": dict(
        tie_word_embeddings=False, num_key_value_heads=2, num_attention_heads=2, dtype="bfloat16",
        max_shard_size="30KB", vocab_size=300,
    ),
}
CHOICES = ("dtype", "max_shard_size", "layout")  # how the model is saved, not Qwen2Config fields
MIN_MARGIN = 1e-3  # each greedy step's top-1 minus top-2 logit: another float order cannot flip the token
CHAT_SYSTEM = "Answer with <think> then <answer>."  # the demo's system prompt, for the chat renderings
CHAT_QUESTIONS = 20  # conversations rendered by apply_chat_template per checkpoint
GENERATE_PROMPTS = 12  # conversations for generate()

# generate(): EOS ids picked from the greedy continuations so that one row stops at its first token, one later, and
# one runs to max_new_tokens; pad id 0 (as the golden batch's left padding).
GENERATION_MODELS = ("untied-gqa-bf16", "tied-mqa-sharded", "untied-gqa-4x-config")

# The model our trainer starts from: Qwen2.5's vocabulary (the embedding 151936 rows as on the Hub) on a tiny body.
INITIAL = dict(
    BASE, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=1024, bos_token_id=151643,
    eos_token_id=151645,
)


def save_config_model(name, choices, out):
    """A random model of this configuration whose greedy continuations of the golden batch have no near-tie (with the
    weights as stored: bfloat16 rounding included), saved by transformers, with its expected.json."""
    fields = {k: v for k, v in choices.items() if k not in CHOICES}
    config = Qwen2Config.from_dict({**BASE, **fields})
    dtype = getattr(torch, choices.get("dtype", "float32"))
    input_ids, attention_mask, _ = golden.batch(config.vocab_size)
    prompts = [input_ids[row, attention_mask[row].bool()].tolist() for row in range(len(golden.LENGTHS))]
    for seed in range(golden.SEED, golden.SEED + 100):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
        stored = model.to(dtype).to(torch.float32)
        if min(min(golden.greedy(stored, p, golden.NEW_TOKENS)[1]) for p in prompts) >= MIN_MARGIN:
            break
    else:
        raise SystemExit(f"references: no seed gives {name} greedy margins >= {MIN_MARGIN}")
    directory = out / "configs" / name
    directory.mkdir(parents=True)
    save = {"safe_serialization": True}
    if "max_shard_size" in choices:
        save["max_shard_size"] = choices["max_shard_size"]
    model.to(dtype).save_pretrained(directory, **save)
    if choices.get("layout") == "4.x":
        # transformers 4's config.json: rope_theta at the top level, torch_dtype, no rope_parameters or layer_types.
        path = directory / "config.json"
        saved = json.loads(path.read_text())
        theta = saved.pop("rope_parameters")["rope_theta"]
        for key in ("layer_types", "dtype"):
            saved.pop(key, None)
        saved.update(rope_theta=theta, torch_dtype="float32", transformers_version="4.45.2")
        path.write_text(json.dumps(saved, indent=2) + "\n")
    # expected.json from the directory as transformers reads it back (the 4.x config included).
    facts = golden.golden_for_checkpoint(str(directory))
    files = sorted(p.name for p in directory.iterdir())
    assert ("model.safetensors.index.json" in files) == ("max_shard_size" in choices), files
    return {"name": name, "seed": seed, "files": files, "nll": facts["nll"],
            "greedy_min_margin": facts["greedy_min_margin"]}


def left_padded(prompts, pad):
    """input_ids and attention_mask [B, longest prompt] of `prompts`, left-padded with `pad` (as generate() takes them)."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt):] = 1
    return input_ids, attention_mask


def generation_case(name, out):
    """transformers' generate() on a left-padded batch, greedy, with EOS and pad ids, rows that stop early."""
    directory = out / "configs" / name
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    expected = json.loads((directory / "expected.json").read_text())
    new_tokens = expected["greedy"]["new_tokens"]
    prompts = expected["greedy"]["prompts"]
    continuations = expected["greedy"]["continuations"]
    margins = [min(m) for m in expected["greedy"]["margins"]]
    # Two more prompts, of one token and of 20, without near-ties in their continuations either.
    generator = torch.Generator().manual_seed(golden.SEED)
    for _ in range(100):
        extra = [torch.randint(1, model.config.vocab_size, (n,), generator=generator).tolist() for n in (1, 20)]
        results = [golden.greedy(model, prompt, new_tokens) for prompt in extra]
        if min(min(m) for _, m in results) >= MIN_MARGIN:
            break
    else:
        raise SystemExit(f"references: {name}: no extra prompts without near-ties")
    prompts = prompts + extra
    continuations = continuations + [tokens for tokens, _ in results]
    margins = margins + [min(m) for _, m in results]
    # The EOS: a token of the continuations at which rows stop in as many ways as possible (at the first step, later,
    # never: that row runs to max_new_tokens).
    def stops(token):
        return [c.index(token) if token in c else None for c in continuations]

    def variety(token):
        s = stops(token)
        return (None in s) + any(i == 0 for i in s if i is not None) + any(i and i >= 2 for i in s if i is not None)

    eos = max(sorted({t for c in continuations for t in c}), key=variety)
    if None not in stops(eos):
        raise SystemExit(f"references: {name}: no EOS choice leaves a row running to max_new_tokens")
    # The pad: an id that occurs in no prompt and no continuation, so that padding cannot pass for a token.
    used = {t for rows in (prompts, continuations) for row in rows for t in row}
    pad = min(set(range(model.config.vocab_size)) - used)
    input_ids, attention_mask = left_padded(prompts, pad)
    width = input_ids.shape[1]
    with torch.no_grad():
        generated = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=new_tokens,
            eos_token_id=eos, pad_token_id=pad,
        )[:, width:]
    rows = generated.tolist()
    return {"model": f"configs/{name}", "prompts": prompts, "eos_token_id": eos, "pad_token_id": pad,
            "max_new_tokens": new_tokens, "sequences": rows, "stops": stops(eos),
            "greedy_min_margin": min(margins)}


def sampling_cases(seed):
    """Random logits (and crafted ties) through transformers' repetition-penalty, temperature, top-k and top-p
    processors, in the order generate() applies them; the kept tokens are the finite scores."""
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    settings = []
    for temperature in (1.0, 0.7, 1.5):
        for top_k in (0, 1, 5, 40):
            for top_p in (1.0, 0.9, 0.3, 0.01):
                settings.append((temperature, top_k, top_p, rng.choice((1.0, 1.0, 1.3, 0.8))))
    cases = []
    for index, (temperature, top_k, top_p, penalty) in enumerate(settings):
        batch, vocab = 3, rng.choice((50, 257, 1000))
        kind = ("normal", "ties", "peaked")[index % 3]
        if kind == "normal":
            logits = torch.randn(batch, vocab, generator=generator) * 3
        elif kind == "ties":  # few distinct values: ties at the top-k and top-p boundaries
            logits = torch.randint(-3, 4, (batch, vocab), generator=generator).float()
        else:  # one or two tokens hold almost all the mass
            logits = torch.randn(batch, vocab, generator=generator)
            logits[:, rng.randrange(vocab)] += 12
            logits[0, rng.randrange(vocab)] += 11
        seen = torch.randint(0, vocab, (batch, 6), generator=generator)
        scores = logits.clone()
        processors = []
        if penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(penalty))
        if temperature != 1.0:
            processors.append(TemperatureLogitsWarper(temperature))
        if top_k > 0:
            processors.append(TopKLogitsWarper(top_k))
        if top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p))
        for processor in processors:
            scores = processor(seen, scores)
        probs = scores.softmax(-1)
        cases.append({
            "kind": kind, "temperature": temperature, "top_k": top_k, "top_p": top_p,
            "repetition_penalty": penalty, "logits": golden.rounded(logits.tolist()), "seen": seen.tolist(),
            "kept": [torch.isfinite(row).nonzero().flatten().tolist() for row in scores],
            "probs": golden.rounded(probs.tolist()),
        })
    return cases


def write_initial(out):
    """A random tiny model with Qwen2.5's vocabulary, its tokenizer and a generation config as Qwen2.5-Instruct's,
    saved by transformers: what our trainer starts from."""
    directory = out / "initial"
    torch.manual_seed(golden.SEED)
    model = AutoModelForCausalLM.from_config(Qwen2Config.from_dict(INITIAL))
    model.generation_config = GenerationConfig(
        bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643, do_sample=True, temperature=0.7,
        top_p=0.8, top_k=20, repetition_penalty=1.05)
    model.save_pretrained(directory, safe_serialization=True)
    AutoTokenizer.from_pretrained(TOKENIZER_DIR).save_pretrained(directory)
    return {"initial": str(directory), "files": sorted(p.name for p in directory.iterdir())}


def make_models(out, seed, strings, conversations):
    started = time.time()
    facts = {"transformers": transformers.__version__, "torch": torch.__version__, "seed": seed}
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "drift").mkdir()
    facts["drift"] = golden.make_new(str(out / "drift"))
    facts["configs"] = [save_config_model(name, choices, out) for name, choices in CONFIGS.items()]
    generation = [generation_case(name, out) for name in GENERATION_MODELS]
    (out / "generation.json").write_text(json.dumps({"transformers": transformers.__version__,
                                                      "cases": generation}) + "\n")
    sampling = sampling_cases(seed)
    (out / "sampling_cases.json").write_text(json.dumps({"transformers": transformers.__version__, "seed": seed,
                                                         "cases": sampling}) + "\n")
    facts["sampling_cases"] = len(sampling)
    facts["initial"] = write_initial(out)
    import chat_cases
    import tokenizer_cases

    facts["tokenizer"] = tokenizer_cases.write(str(out), seed, strings)
    facts["chat"] = chat_cases.write(str(out), seed, conversations)
    facts["seconds"] = round(time.time() - started, 1)
    (out / "facts.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


def check_checkpoints(out, directories):
    """transformers on each checkpoint our trainer wrote. Loading info is checked here; the outputs go to the C++
    test (tests/transformers/checkpoint_test.cpp), which compares them with ours."""
    from safetensors.torch import save_file

    questions = [json.loads(line)["question"] for line in (SHARED / "data" / "gsm8k" / "test.jsonl").open()][:200]
    report = {"transformers": transformers.__version__, "checkpoints": []}
    for k, directory in enumerate(directories):
        model, info = AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True, dtype="auto")
        problems = {key: value for key, value in info.items() if value}
        if problems:
            raise SystemExit(f"references: transformers loads {directory} with {problems}")
        stored_dtype = str(model.dtype).replace("torch.", "")
        model = model.to(torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(directory)
        ids = [tokenizer(q, add_special_tokens=False)["input_ids"] for q in questions]
        generation = GenerationConfig.from_pretrained(directory)
        chats = [tokenizer.apply_chat_template(conversation(q), tokenize=False, add_generation_prompt=True)
                 for q in questions[:CHAT_QUESTIONS]]
        # A left-padded batch of three questions' first tokens, pad = the tokenizer's pad id.
        pad = tokenizer.pad_token_id
        prompts = [ids[0][:12], ids[1][:5], ids[2][:9]]
        input_ids, attention_mask = left_padded(prompts, pad)
        position_ids = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
        with torch.no_grad():
            logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        tensors = {"input_ids": input_ids, "attention_mask": attention_mask, "logits": logits.float().contiguous()}
        save_file(tensors, str(out / f"checkpoint-{k}.safetensors"))
        report["checkpoints"].append({
            "dir": str(directory), "class": type(model).__name__, "stored_dtype": stored_dtype,
            "loading_info": {key: list(value) for key, value in info.items()},
            "tied": bool(model.config.tie_word_embeddings), "questions": questions, "question_ids": ids,
            "pad_token_id": pad, "eos_token_id": tokenizer.eos_token_id, "chat_system": CHAT_SYSTEM,
            "chat_texts": chats, "chat_ids": [tokenizer(text, add_special_tokens=False)["input_ids"] for text in chats],
            "generation_config": json.loads(generation.to_json_string(use_diff=False)),
            "outputs": f"checkpoint-{k}.safetensors",
        })
    (out / "checkpoints.json").write_text(json.dumps(report) + "\n")
    return {"checkpoints": len(directories)}


def conversation(question):
    return [{"role": "system", "content": CHAT_SYSTEM}, {"role": "user", "content": question}]


def generate_references(out, directory, new_tokens):
    """generate() on a checkpoint of ours (the held-out check's shape): greedy, a left-padded batch of GSM8K
    conversations rendered by the checkpoint's own chat template, stopping at <|im_end|> or <|endoftext|> (training's
    stop ids). OUT/generate_input.jsonl holds the same conversations for `qwen_gsm8k generate`; OUT/generate.json each
    row's prompt ids, tokens (up to the first stop id) and every step's top-1 minus top-2 logit, for
    tests/transformers/generation_test.cpp to compare where no near-tie can flip a token."""
    questions = [json.loads(line)["question"] for line in (SHARED / "data" / "gsm8k" / "test.jsonl").open()]
    conversations = [conversation(q) for q in questions[:GENERATE_PROMPTS]]
    with (out / "generate_input.jsonl").open("w") as lines:
        for messages in conversations:
            lines.write(json.dumps({"messages": messages}) + "\n")
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    prompts = [tokenizer(tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
                         add_special_tokens=False)["input_ids"] for m in conversations]
    stop = [tokenizer.convert_tokens_to_ids(name) for name in ("<|im_end|>", "<|endoftext|>")]
    input_ids, attention_mask = left_padded(prompts, tokenizer.pad_token_id)
    with torch.no_grad():
        result = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
                                max_new_tokens=new_tokens, eos_token_id=stop, pad_token_id=tokenizer.pad_token_id,
                                output_logits=True, return_dict_in_generate=True)
    generated = result.sequences[:, input_ids.shape[1]:].tolist()
    top = torch.stack(result.logits, dim=1).float().topk(2, dim=-1).values  # [B, L, 2]
    margins = (top[..., 0] - top[..., 1]).tolist()
    rows = []
    for b, tokens in enumerate(generated):
        length = next((t + 1 for t, token in enumerate(tokens) if token in stop), len(tokens))
        rows.append({"prompt_ids": prompts[b], "tokens": tokens[:length], "margins": margins[b][:length],
                     "stopped": tokens[length - 1] in stop})
    report = {"model": str(directory), "max_new_tokens": new_tokens, "stop_ids": stop, "min_margin": MIN_MARGIN,
              "rows": rows}
    (out / "generate.json").write_text(json.dumps(report) + "\n")
    return {"generate_rows": len(rows)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("models", "checkpoints"))
    parser.add_argument("out", type=Path)
    parser.add_argument("dirs", nargs="*")
    parser.add_argument("--strings", type=int, default=20000)
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--generate", type=Path, default=None)
    parser.add_argument("--generate-tokens", type=int, default=24)
    args = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.mode == "models":
        seed = args.seed
        if seed is None:
            seed = int(os.environ.get("DAPO_FUZZ_SEED") or random.SystemRandom().randrange(1, 2**31))
        facts = make_models(args.out, seed, args.strings, args.conversations)
    else:
        if not args.dirs:
            parser.error("checkpoints needs the checkpoint directories")
        facts = check_checkpoints(args.out, args.dirs)
        if args.generate is not None:
            facts.update(generate_references(args.out, args.generate, args.generate_tokens))
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
