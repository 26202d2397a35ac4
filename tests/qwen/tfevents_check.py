#!/usr/bin/env python3
"""Reads a run's TensorBoard event file with a reader of its own (Python standard library only: its own CRC-32C and
protobuf decoding, nothing shared with the C++ writer) and checks it against metrics.jsonl.

  tfevents_check.py RUN_DIR                 check a finished run directory
  tfevents_check.py --run BINARY WORK_DIR   first run a short `BINARY demo` into WORK_DIR/run, then check it

Checks: every record's length and data CRCs (masked CRC-32C), the first event is file_version "brain.Event:2", each
metrics.jsonl row has one event at its step holding every numeric field of the row (as float32, the way add_scalar
stores it) and nothing else, verl's metric names are among them, and eval.jsonl's accuracy is there as eval/accuracy.
Exits 1 with the first difference.
"""
import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys

VERL_NAMES = [
    "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/entropy", "actor/pg_loss",
    "actor/grad_norm", "actor/lr", "critic/score/mean", "critic/score/max", "critic/score/min",
    "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min", "response_length/mean",
    "response_length/max", "response_length/min", "response_length/clip_ratio", "prompt_length/mean",
    "timing_s/gen", "timing_s/update_actor", "timing_s/step", "perf/throughput", "train/num_gen_batches",
]


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    data = open(path, "rb").read()
    offset = 0
    while offset < len(data):
        if offset + 12 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {offset}")
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if masked(crc32c(header)) != length_crc:
            raise ValueError(f"{path}: bad length CRC at byte {offset}")
        body = data[offset + 12:offset + 12 + length]
        (body_crc,) = struct.unpack("<I", data[offset + 12 + length:offset + 16 + length])
        if len(body) != length or masked(crc32c(body)) != body_crc:
            raise ValueError(f"{path}: bad data CRC at byte {offset}")
        yield body
        offset += 16 + length


def fields(message):
    """(field number, wire type, value) of a protobuf message; value: int, bytes, or raw 4/8 bytes."""
    i = 0
    while i < len(message):
        key, i = varint(message, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(message, i)
        elif wire == 1:
            value, i = message[i:i + 8], i + 8
        elif wire == 2:
            size, i = varint(message, i)
            value, i = message[i:i + size], i + size
        elif wire == 5:
            value, i = message[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire} in an Event")
        yield number, wire, value


def varint(data, i):
    result, shift = 0, 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, i


def read_events(path):
    events = []
    for body in records(path):
        event = {"step": 0, "scalars": {}}
        for number, wire, value in fields(body):
            if number == 1 and wire == 1:
                event["wall_time"] = struct.unpack("<d", value)[0]
            elif number == 2 and wire == 0:
                event["step"] = value
            elif number == 3 and wire == 2:
                event["file_version"] = value.decode()
            elif number == 5 and wire == 2:
                for vnumber, _, entry in fields(value):
                    if vnumber != 1:
                        continue
                    tag, simple = None, None
                    for enumber, ewire, evalue in fields(entry):
                        if enumber == 1:
                            tag = evalue.decode()
                        elif enumber == 2 and ewire == 5:
                            simple = struct.unpack("<f", evalue)[0]
                    event["scalars"][tag] = simple
        events.append(event)
    return events


def as_float32(value):
    return struct.unpack("<f", struct.pack("<f", float(value)))[0]


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def check(run):
    files = sorted(glob.glob(os.path.join(run, "events.out.tfevents.*")))
    if len(files) != 1:
        raise ValueError(f"{run}: expected one events.out.tfevents.* file, found {len(files)}")
    events = read_events(files[0])
    if events[0].get("file_version") != "brain.Event:2":
        raise ValueError(f"{files[0]}: the first event is not file_version brain.Event:2: {events[0]}")
    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if line.strip()]
    evals = [json.loads(line) for line in open(os.path.join(run, "eval.jsonl")) if line.strip()]
    step_events = [e for e in events[1:] if not any(t.startswith("eval/") for t in e["scalars"])]
    eval_events = [e for e in events[1:] if any(t.startswith("eval/") for t in e["scalars"])]
    if len(step_events) != len(rows) or len(eval_events) != len(evals):
        raise ValueError(f"{len(step_events)} step and {len(eval_events)} eval events for {len(rows)} metrics rows "
                         f"and {len(evals)} evaluations")
    compared = 0
    for row, event in zip(rows, step_events):
        if event["step"] != row["step"]:
            raise ValueError(f"event step {event['step']} for metrics row of step {row['step']}")
        numbers = {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
        if set(numbers) != set(event["scalars"]):
            raise ValueError(f"step {row['step']}: tags {sorted(set(event['scalars']) ^ set(numbers))} differ")
        for name in VERL_NAMES:
            if name not in numbers:
                raise ValueError(f"step {row['step']}: {name} missing from metrics.jsonl")
        for key, value in numbers.items():
            if not same(event["scalars"][key], as_float32(value)):
                raise ValueError(f"step {row['step']} {key}: event {event['scalars'][key]!r}, jsonl {value!r}")
            compared += 1
    for row, event in zip(evals, eval_events):
        if event["step"] != row["step"] or not same(event["scalars"]["eval/accuracy"], as_float32(row["accuracy"])):
            raise ValueError(f"evaluation at step {row['step']}: event {event}")
    print(f"tfevents_check: {files[0]}: {len(events)} records, CRCs valid; {len(rows)} steps, {compared} scalars "
          f"equal to metrics.jsonl; {len(evals)} evaluations")


def main(argv):
    if len(argv) == 3 and argv[0] == "--run":
        binary, work = argv[1], argv[2]
        run = os.path.join(work, "run")
        shutil.rmtree(run, ignore_errors=True)
        # GRPO: no dynamic sampling, which a 20-update warm start could not satisfy.
        subprocess.run([binary, "demo", "--algo", "grpo", "--output", run, "--sft-steps", "20", "--sft-min-steps", "20",
                        "--rl-steps", "2", "--rl-groups", "4", "--rl-mini-groups", "2", "--eval-every", "1",
                        "--eval-problems", "8", "--logger", "console,jsonl,tensorboard"], check=True)
        check(run)
    elif len(argv) == 1:
        check(argv[0])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (ValueError, KeyError, OSError, subprocess.CalledProcessError) as error:
        print(f"tfevents_check: FAILED: {error}", file=sys.stderr)
        sys.exit(1)
