"""Seed inputs for the fuzz targets made from the reference data (../shared), which stays out of the repository:
scripts/fuzz.sh runs this into a scratch directory and hands each target its folder besides corpus/<target>/.
Usage: shared_seeds.py SHARED_DIR OUT_DIR. Python's standard library only."""
import json
import pathlib
import sys

shared, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
corpus = pathlib.Path(__file__).resolve().parent / "corpus"


def put(target, name, data):
    folder = out / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())


qwen2 = shared / "fixtures" / "qwen2"
for model in sorted(qwen2.iterdir()):
    put("config_json", model.name, (model / "config.json").read_bytes())
    for weights in sorted(model.glob("*.safetensors")):
        put("safetensors_header", f"{model.name}-{weights.name}", weights.read_bytes())
    index = model / "model.safetensors.index.json"
    if index.exists():
        put("shard_index", model.name, index.read_bytes())

tokenizer = shared / "fixtures" / "tokenizer"
config = (tokenizer / "qwen2.5" / "tokenizer_config.json").read_bytes()
put("tokenizer_json", "small-tokenizer-qwen-config", (corpus / "tokenizer_json" / "small-tokenizer").read_bytes() + b"\0" + config)
put("chat_template", "qwen2.5", json.loads(config)["chat_template"])
for i, item in enumerate(json.loads((tokenizer / "golden_encodings.json").read_text())):
    put("tokenizer_text", f"golden-{i:03d}", item["text"])
for i, item in enumerate(json.loads((tokenizer / "golden_chat.json").read_text())):
    line = {"messages": item["messages"], "add_generation_prompt": item["add_generation_prompt"]}
    put("chat_messages", f"golden-{i:02d}", json.dumps(line, ensure_ascii=False))

gsm8k = shared / "data" / "gsm8k"
with open(gsm8k / "test.jsonl", encoding="utf-8") as lines:
    rows = [next(lines) for _ in range(64)]
for i, row in enumerate(rows[:48]):
    put("gsm8k_line", f"test-{i:02d}", row)
    problem = json.loads(row)
    reference = problem["answer"].split("####")[-1].strip()
    put("reward", f"test-{i:02d}", f"{reference}\n<think>\n{problem['answer'].splitlines()[0]}\n</think>\n"
                                     f"<answer>\n{reference}\n</answer>\n")
put("gsm8k_line", "test-16-lines", "".join(rows[48:]))
