#!/usr/bin/env python3
"""The table of scripts/device-check.sh: reads what its stages left in RESULTS (JSON records of the benchmarks,
transformers' facts, the test cases' measured differences) and writes OUT/report.md (one Markdown table, ready for
docs/benchmarks.md) and OUT/results.json (everything, merged). Standard library only: it runs on every machine.

  device_report.py RESULTS OUT [--dry-run 0|1]
"""
import json
import os
import re
import sys

BANDWIDTH_TB_S = 4.3  # H200 HBM3e, the bound generate_bench reports against


def load(results, name):
    path = os.path.join(results, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        if name.endswith(".jsonl"):
            return [json.loads(line) for line in f if line.strip()]
        if name.endswith(".json"):
            text = f.read().strip()
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                pass
            # The Python stages print one JSON object on its own line after their own output (tee'd here).
            for line in reversed(text.splitlines()):
                if line.startswith("{"):
                    try:
                        return json.loads(line)
                    except json.JSONDecodeError:
                        continue
            return None
        return f.read()


def number(value, digits=1, unit=""):
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if value != 0 and abs(value) < 10 ** -digits:
            return f"{value:.1e}{unit}"
        return f"{value:,.{digits}f}{unit}"
    return str(value)


def ratio(ours, theirs, higher_is_better=True):
    if not ours or not theirs:
        return "—"
    return f"{(ours / theirs if higher_is_better else theirs / ours):.2f}x"


def golden_lines(text):
    """The MESSAGE lines of tests/qwen/model_test.cpp: 'golden NAME on DEVICE: logits max |diff| X, ...'."""
    rows = []
    for match in re.finditer(r"(transformers golden|golden) (\S+) on (cpu|cuda): (.*)", text or ""):
        rows.append((match.group(2), match.group(3), match.group(4).strip()))
    return rows


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: device_report.py RESULTS OUT [--dry-run 0|1]")
    results, out = argv[1], argv[2]
    dry_run = len(argv) > 4 and argv[3] == "--dry-run" and argv[4] == "1"
    merged = {name: load(results, name) for name in sorted(os.listdir(results))} if os.path.isdir(results) else {}
    stages = merged.get("stages.jsonl") or []
    machine = (merged.get("machine.txt") or "").strip().splitlines()

    rows = []  # (section, what, ours, transformers, ratio)

    def add(section, what, ours="", theirs="", versus=""):
        rows.append((section, what, ours, theirs, versus))

    for stage in stages:
        add("stages", stage["stage"], f'{stage["status"]} ({stage["seconds"]} s)')

    ours, hf = merged.get("generate_ours.json"), merged.get("generate_transformers.json")
    if ours:
        settings = (f'{ours.get("shape")}, {ours.get("dtype")}, batch {ours.get("batch")}, prompt {ours.get("prompt")}, '
                    f'{ours.get("new_tokens")} new tokens, greedy, EOS ignored')
        hf = hf or {}
        add("generate", f"settings: {settings}")
        add("generate", "tokens/s", number(ours.get("tokens_per_second")), number(hf.get("tokens_per_second")),
            ratio(ours.get("tokens_per_second"), hf.get("tokens_per_second")))
        add("generate", "decode ms per step", number(ours.get("decode_ms_per_step"), 2),
            number(hf.get("decode_ms_per_step"), 2),
            ratio(ours.get("decode_ms_per_step"), hf.get("decode_ms_per_step"), higher_is_better=False))
        add("generate", "prefill + first token, ms", number(ours.get("prefill_ms")), number(hf.get("prefill_ms")),
            ratio(ours.get("prefill_ms"), hf.get("prefill_ms"), higher_is_better=False))
        bound = ours.get("bandwidth_bound_ms_per_step")
        if bound:
            add("generate", f"bandwidth bound ms per step (weights + KV cache / {BANDWIDTH_TB_S} TB/s)",
                number(bound, 2), number(bound, 2))
            add("generate", "fraction of the bound reached",
                number(bound / ours["decode_ms_per_step"], 2) if ours.get("decode_ms_per_step") else "—",
                number(bound / hf["decode_ms_per_step"], 2) if hf.get("decode_ms_per_step") else "—")
        add("generate", "peak GPU memory, GiB", number(_gib(ours.get("peak_device_memory_bytes")), 2),
            number(_gib(hf.get("peak_memory_bytes")), 2))
        backends = ours.get("attention_backends")
        if backends:  # at::_fused_sdp_choice: 0 math, 1 flash, 2 memory-efficient, 3 cuDNN
            names = {0: "math", 1: "flash", 2: "memory-efficient", 3: "cuDNN", -1: "eager products"}
            add("generate", "attention backend: training (causal), decode, prefill",
                ", ".join(names.get(backends.get(k), str(backends.get(k)))
                          for k in ("training_causal", "decode", "prefill")))
        engine = ours.get("engine") or {}
        eager, graphs = engine.get("eager") or {}, engine.get("cuda_graphs") or {}
        if eager:
            add("generate", "engine tokens/s: eager steps", number(eager.get("tokens_per_second")))
        if graphs:
            add("generate", "engine tokens/s: CUDA graphs (captures included)", number(graphs.get("tokens_per_second")),
                "", ratio(graphs.get("tokens_per_second"), eager.get("tokens_per_second")))
            add("generate", "engine CUDA graphs: captured, replayed, steps, rows identical to eager",
                f'{graphs.get("graph_captures")}, {graphs.get("graph_replays")}, {graphs.get("decode_calls")}, '
                f'{number(graphs.get("rows_identical_to_eager"), 2)}')

    for name, label in (("step_seed.json", "DAPO step, seed settings"), ("step_verl.json", "DAPO step, larger")):
        step = merged.get(name)
        if not step:
            continue
        settings = step.get("settings", {})
        add(label, "settings", f'{step.get("shape")} on {step.get("device", "cpu")}, '
            f'{settings.get("train_batch_size")} prompts x {settings.get("rollout_n")}, '
            f'{settings.get("max_new_tokens")} new tokens, autocast {step.get("autocast", "off")}')
        add(label, "rollout tokens/s (generated)", number(step.get("rollout_tokens_per_second")))
        add(label, "update tokens/s", number(step.get("update_tokens_per_second")))
        add(label, "step seconds (rollout + update)",
            f'{number(step.get("step_seconds"), 2)} ({number(step.get("rollout_seconds"), 2)} + '
            f'{number(step.get("update_seconds"), 2)})')
        add(label, "peak GPU memory, GiB", number(_gib(step.get("peak_device_memory_bytes")), 2))
        plan = step.get("memory_plan") or {}
        add(label, "memory plan's peak, GiB", number(_gib(plan.get("peak_bytes")), 2))

    shared = merged.get("shared_prompt.json")
    if shared:
        label = "update, each group's prompt once"
        add(label, "settings", f'{shared.get("shape")} on {shared.get("device", "cpu")}, autocast '
            f'{shared.get("autocast", "off")}, prompt ~{shared.get("prompt")}, responses ~{shared.get("response")}')
        for result in shared.get("results") or []:
            g = result.get("rollout_n")
            add(label, f"G = {g}: update tokens/s, each row whole -> shared (speed-up)",
                f'{number(result.get("tokens_per_second"))} -> {number(result.get("shared_tokens_per_second"))} '
                f'({number(result.get("speedup"), 2)}x)')
            add(label, f"G = {g}: peak memory, GiB, whole -> shared",
                f'{number(_gib(result.get("peak_bytes")), 2)} -> {number(_gib(result.get("shared_peak_bytes")), 2)}')

    fixture = merged.get("fixture.json")
    if fixture:
        add("fidelity", "transformers / PyTorch", f'{fixture.get("transformers")} / {fixture.get("torch")}')
        add("fidelity", "transformers' generate() = its greedy loop", number(fixture.get("generate_agrees_with_loop")))
        add("fidelity", "transformers CUDA vs CPU: logits max |diff|",
            "", number(fixture.get("cuda_vs_cpu_logits_max_abs"), 8))
    for name in ("cuda_tests.txt", "checkpoint_test.txt"):
        for golden, device, detail in golden_lines(merged.get(name)):
            add("fidelity", f"ours vs golden {golden} on {device}", detail)
    checkpoint = merged.get("checkpoint.json")
    if checkpoint:
        add("fidelity", "our trainer's checkpoint loads with from_pretrained",
            f'{checkpoint.get("loaded_class", "—")}')

    demo = merged.get("demo_summary.json")
    if demo:
        add("demo", f'greedy accuracy before -> after (seed {demo.get("seed", 1)}, {demo.get("device", "cpu")})',
            f'{number(demo.get("sft_accuracy"), 3)} -> {number(demo.get("final_accuracy"), 3)}')
        add("demo", "wall seconds", number(demo.get("wall_seconds")))

    lines = ["# scripts/device-check.sh" + (" --dry-run (CPU, tiny sizes: not numbers to publish)" if dry_run else ""),
             "", "Machine: " + "; ".join(machine), "",
             "| section | what | ours | transformers | ours vs transformers |", "|---|---|---|---|---|"]
    lines += [f"| {s} | {w} | {o} | {t} | {v} |" for s, w, o, t, v in rows]
    report = "\n".join(lines) + "\n"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(report)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(merged, f, indent=1, default=str)
    print(report)


def _gib(value):
    return value / 2**30 if isinstance(value, (int, float)) else None


if __name__ == "__main__":
    main(sys.argv)
