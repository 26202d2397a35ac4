#!/usr/bin/env python3
"""The report of scripts/device-check.sh: reads what its stages have left in RESULTS so far (JSON records of the
benchmarks, the trainer's metrics, transformers' facts, the test cases' measured differences, the kernel profile) and
writes OUT/report.md (one Markdown table, ready for docs/benchmarks.md), OUT/results.json (everything, merged) and
OUT/profile.md (the profile's tables, when the profile stage has run). The check calls it after every stage, so OUT
always holds what has landed; each file is written whole under another name, then renamed. Standard library only: it
runs on every machine.

  device_report.py RESULTS OUT [--dry-run 0|1] [--call headline|rest]
"""
import json
import os
import re
import shutil
import sys


def load(results, name):
    path = os.path.join(results, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        if name.endswith(".jsonl"):
            rows = []
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut off by a stopped stage
            return rows
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


def gib(value):
    return value / 2**30 if isinstance(value, (int, float)) else None


def golden_lines(text):
    """The MESSAGE lines of tests/qwen/model_test.cpp: 'golden NAME on DEVICE: logits max |diff| X, ...'."""
    rows = []
    for match in re.finditer(r"(transformers golden|golden) (\S+) on (cpu|cuda): (.*)", text or ""):
        rows.append((match.group(2), match.group(3), match.group(4).strip()))
    return rows


def generate_rows(add, ours, hf):
    settings = (f'{ours.get("shape")}, {ours.get("dtype")}, batch {ours.get("batch")}, prompt {ours.get("prompt")}, '
                f'{ours.get("new_tokens")} new tokens, greedy, EOS ignored, on {ours.get("device_name")}')
    hf = hf or {}
    add("generate", f"settings: {settings}")
    datasheet = ours.get("datasheet_bandwidth_gbs")
    add("generate", "memory bandwidth, GB/s: a copy measured here (the data sheet's)",
        f'{number(ours.get("copy_bandwidth_gbs"), 0)} ({number(datasheet, 0)})')
    bound = ours.get("bandwidth_bound_ms_per_step")
    add("generate", f'bandwidth bound, ms per decode step (weights + KV cache at {number(ours.get("bandwidth_gbs"), 0)} '
        "GB/s)", number(bound, 3))
    engine = ours.get("engine") or {}
    for key, label in (("cuda_graphs", "engine, CUDA graphs"), ("eager", "engine, eager steps")):
        mode = engine.get(key)
        if not mode:
            continue
        versus = key == ours.get("engine_mode")  # the trainer's mode here, beside transformers
        add("generate", f"{label}: tokens/s", number(mode.get("tokens_per_second")),
            number(hf.get("tokens_per_second")) if versus else "",
            ratio(mode.get("tokens_per_second"), hf.get("tokens_per_second")) if versus else "")
        add("generate", f"{label}: decode ms per step", number(mode.get("decode_ms_per_step"), 3),
            number(hf.get("decode_ms_per_step"), 3) if versus else "",
            ratio(mode.get("decode_ms_per_step"), hf.get("decode_ms_per_step"), False) if versus else "")
        add("generate", f"{label}: prefill + first token, ms", number(mode.get("prefill_ms"), 2),
            number(hf.get("prefill_ms"), 2) if versus else "",
            ratio(mode.get("prefill_ms"), hf.get("prefill_ms"), False) if versus else "")
        hf_fraction = bound / hf["decode_ms_per_step"] if bound and hf.get("decode_ms_per_step") else None
        add("generate", f"{label}: fraction of the bandwidth bound", number(mode.get("bound_over_measured"), 3),
            number(hf_fraction, 3) if versus else "")
        add("generate", f"{label}: peak GPU memory, GiB", number(gib(mode.get("peak_device_memory_bytes")), 2),
            number(gib(hf.get("peak_memory_bytes")), 2) if versus else "")
        if key == "cuda_graphs":
            add("generate", f"{label}: captured, replayed, decode steps, rows identical to eager",
                f'{mode.get("graph_captures")}, {mode.get("graph_replays")}, {mode.get("decode_calls")}, '
                f'{number(mode.get("rows_identical_to_eager"), 2)}')
    loop = ours.get("generate_call") or {}
    if loop:
        add("generate", "generate() (the engine in one call, engine made and graphs captured each call): tokens/s, "
            "decode ms per step",
            f'{number(loop.get("tokens_per_second"))}, {number(loop.get("decode_ms_per_step"), 3)}')
    backends = ours.get("attention_backends")
    if backends:  # at::_fused_sdp_choice: 0 math, 1 flash, 2 memory-efficient, 3 cuDNN
        names = {0: "math", 1: "flash", 2: "memory-efficient", 3: "cuDNN", -1: "eager products"}
        add("generate", "attention backend: training (causal), decode, prefill",
            ", ".join(names.get(backends.get(k), str(backends.get(k))) for k in ("training_causal", "decode", "prefill")))


def train_rows(add, metrics, plan):
    label = "DAPO step, seed settings, qwen_gsm8k train"
    steps = [row for row in metrics or [] if "timing_s/step" in row]
    if plan:
        add(label, "memory plan's peak, GiB (phase)", f'{number(gib(plan.get("peak_bytes")), 2)} '
            f'({plan.get("peak_phase", "—")})')
    for row in steps:
        step = row.get("step", "?")
        add(label, f"step {step}: seconds (rollout + update)",
            f'{number(row.get("timing_s/step"), 2)} ({number(row.get("timing_s/gen"), 2)} + '
            f'{number(row.get("timing_s/update_actor"), 2)})')
        add(label, f"step {step}: generation rounds, groups kept / filtered / dropped",
            f'{row.get("train/num_gen_batches")}, {row.get("dapo/kept_groups")} / {row.get("dapo/filtered_groups")} / '
            f'{row.get("dapo/dropped_groups")}')
        add(label, f"step {step}: decode steps, admissions, checks, graph captures, replays",
            f'{row.get("perf/decode_calls")}, {row.get("perf/prefill_calls")}, {row.get("perf/engine_checks")}, '
            f'{row.get("perf/graph_captures")}, {row.get("perf/graph_replays")}')
        add(label, f"step {step}: the rollout's host reads (waits), fetches, host-to-device copies",
            f'{row.get("perf/host_reads", "—")}, {row.get("perf/host_fetches", "—")}, '
            f'{row.get("perf/host_copies", "—")}')
        add(label, f"step {step}: rollout tokens/s, update tokens/s",
            f'{number(row.get("perf/rollout_tokens_per_second"))}, {number(row.get("perf/update_tokens_per_second"))}')
        add(label, f"step {step}: peak memory allocated / reserved, GiB",
            f'{number(row.get("perf/max_memory_allocated_gb"), 2)} / '
            f'{number(row.get("perf/max_memory_reserved_gb"), 2)}')


def profile_rows(add, profile):
    label = "kernel profile"
    kernels = profile.get("kernels")
    add(label, "settings", f'{profile.get("shape")} on {profile.get("device_name")}, autocast '
        f'{profile.get("autocast")}; tables in profile.md')
    names = (("decode_eager", "decode step, eager"), ("decode_graphs", "decode step, CUDA graphs"),
             ("admit_graphs", "admission, CUDA graphs"), ("admit_eager", "admission, eager"),
             ("update_micro_batch", "update micro-batch"), ("optimizer_step", "optimizer step"))
    for key, name in names:
        part = (profile.get("parts") or {}).get(key)
        if not part or not part.get("instances"):
            continue
        if kernels:
            top = (part.get("top") or [{}])[0]
            add(label, f"{name}: kernels, device ms, wall ms per instance; GPU busy",
                f'{number(part.get("kernels_per_instance"), 0)}, {number(part.get("device_ms_per_instance"), 3)}, '
                f'{number(part.get("wall_ms_per_instance"), 3)}; {number(100 * part.get("busy_fraction", 0), 0)} %')
            if top:
                add(label, f"{name}: the top kernel (ms per instance)",
                    f'`{top.get("name", "")[:60]}` ({number(top.get("ms_per_instance"), 3)})')
        else:
            add(label, f"{name}: operators per instance (top level), host ms",
                f'{number(part.get("operators_per_instance"), 0)} '
                f'({number(part.get("top_level_operators_per_instance"), 0)}), '
                f'{number(part.get("wall_ms_per_instance"), 3)}')


def rest_rows(add, merged):
    step = merged.get("step_verl.json")
    if step:
        label = "DAPO step, larger (step_bench)"
        settings = step.get("settings", {})
        add(label, "settings", f'{step.get("shape")} on {step.get("device", "cpu")}, '
            f'{settings.get("train_batch_size")} prompts x {settings.get("rollout_n")}, '
            f'{settings.get("max_new_tokens")} new tokens, autocast {step.get("autocast", "off")}')
        add(label, "rollout tokens/s (generated)", number(step.get("rollout_tokens_per_second")))
        add(label, "update tokens/s", number(step.get("update_tokens_per_second")))
        add(label, "step seconds (rollout + update)",
            f'{number(step.get("step_seconds"), 2)} ({number(step.get("rollout_seconds"), 2)} + '
            f'{number(step.get("update_seconds"), 2)})')
        add(label, "peak GPU memory, GiB", number(gib(step.get("peak_device_memory_bytes")), 2))
        plan = step.get("memory_plan") or {}
        add(label, "memory plan's peak, GiB", number(gib(plan.get("peak_bytes")), 2))

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
                f'{number(gib(result.get("peak_bytes")), 2)} -> {number(gib(result.get("shared_peak_bytes")), 2)}')

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
        add("fidelity", "our trainer's checkpoint loads with from_pretrained", f'{checkpoint.get("loaded_class", "—")}')

    demo = merged.get("demo_summary.json")
    if demo:
        add("demo", f'greedy accuracy before -> after (seed {demo.get("seed", 1)}, {demo.get("device", "cpu")})',
            f'{number(demo.get("sft_accuracy"), 3)} -> {number(demo.get("final_accuracy"), 3)}')
        add("demo", "wall seconds", number(demo.get("wall_seconds")))


def write_whole(path, text):
    """The file appears whole or not at all: a command killed while writing leaves the previous version."""
    partial = path + ".partial"
    with open(partial, "w") as f:
        f.write(text)
    os.replace(partial, path)


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: device_report.py RESULTS OUT [--dry-run 0|1] [--call headline|rest]")
    results, out = argv[1], argv[2]
    options = dict(zip(argv[3::2], argv[4::2]))
    dry_run = options.get("--dry-run") == "1"
    call = options.get("--call", "headline")
    names = sorted(os.listdir(results)) if os.path.isdir(results) else []
    merged = {name: load(results, name) for name in names
              if not name.endswith(".md") and os.path.isfile(os.path.join(results, name))}
    # The train stage's run directory: its metrics.jsonl grows a row per step, read as far as it has come.
    if os.path.isdir(os.path.join(results, "train-run")):
        merged["train_metrics.jsonl"] = load(os.path.join(results, "train-run"), "metrics.jsonl")
    machine = (merged.get("machine.txt") or "").strip().splitlines()

    rows = []  # (section, what, ours, transformers, ratio)

    def add(section, what, ours="", theirs="", versus=""):
        rows.append((section, what, ours, theirs, versus))

    for stage in merged.get("stages.jsonl") or []:
        add("stages", stage["stage"], f'{stage["status"]} ({stage["seconds"]} s)')
    if merged.get("generate_ours.json"):
        generate_rows(add, merged["generate_ours.json"], merged.get("generate_transformers.json"))
    if merged.get("train_metrics.jsonl") or merged.get("train_memory_plan.json"):
        train_rows(add, merged.get("train_metrics.jsonl"), merged.get("train_memory_plan.json"))
    if merged.get("profile.json"):
        profile_rows(add, merged["profile.json"])
    rest_rows(add, merged)

    title = f"# scripts/device-check.sh {call}"
    if dry_run:
        title += " --dry-run (CPU, tiny sizes: not numbers to publish)"
    lines = [title, "", "Machine: " + "; ".join(machine), "",
             "| section | what | ours | transformers | ours vs transformers |", "|---|---|---|---|---|"]
    lines += [f"| {s} | {w} | {o} | {t} | {v} |" for s, w, o, t, v in rows]
    report = "\n".join(lines) + "\n"
    os.makedirs(out, exist_ok=True)
    write_whole(os.path.join(out, "report.md"), report)
    write_whole(os.path.join(out, "results.json"), json.dumps(merged, indent=1, default=str))
    if os.path.exists(os.path.join(results, "profile.md")):
        shutil.copyfile(os.path.join(results, "profile.md"), os.path.join(out, "profile.md.partial"))
        os.replace(os.path.join(out, "profile.md.partial"), os.path.join(out, "profile.md"))
    print(report)


if __name__ == "__main__":
    main(sys.argv)
