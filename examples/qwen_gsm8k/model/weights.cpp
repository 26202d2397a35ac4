// Loading and saving weights in the Hugging Face layout (single file or sharded), checked against the model.
#include "qwen_gsm8k/model/weights.hpp"

#include <dapo/core/error.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "qwen_gsm8k/common/atomic_file.hpp"
#include "qwen_gsm8k/common/json_error.hpp"
#include "qwen_gsm8k/model/safetensors.hpp"
#include "qwen_gsm8k/model/safetensors_header.hpp"

namespace qwen {
namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kGenerationConfig = "generation_config.json";

// Decimal units, as transformers' max_shard_size ("5GB" = 5e9 bytes) counts them.
std::string size_text(uint64_t bytes) {
  char text[32];
  if (bytes >= 1'000'000'000) {
    std::snprintf(text, sizeof text, "%.1f GB", static_cast<double>(bytes) / 1e9);
  } else if (bytes >= 1'000'000) {
    std::snprintf(text, sizeof text, "%.1f MB", static_cast<double>(bytes) / 1e6);
  } else {
    std::snprintf(text, sizeof text, "%.1f kB", static_cast<double>(bytes) / 1e3);
  }
  return text;
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path.string() + ": cannot open (does it exist and is it readable?)");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    throw std::runtime_error(path.string() + ": invalid JSON " + json_error_where(error));
  }
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot open (does it exist and is it readable?)");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The safetensors files of a checkpoint directory, with the tensors each should hold (empty: whatever it holds).
std::map<std::filesystem::path, std::set<std::string>> checkpoint_files(const std::filesystem::path& dir) {
  std::map<std::filesystem::path, std::set<std::string>> files;
  const auto index_path = dir / kIndexFile;
  if (std::filesystem::exists(index_path)) {
    std::ifstream in(index_path);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) throw std::runtime_error(index_path.string() + ": cannot be read");
    for (const auto& [name, file] : parse_shard_index(text.str(), index_path.string())) files[dir / file].insert(name);
    return files;
  }
  if (std::filesystem::exists(dir / kSingleFile)) {
    files[dir / kSingleFile];
    return files;
  }
  throw std::runtime_error(dir.string() + ": no " + kSingleFile + " and no " + kIndexFile +
                           " (expected a Hugging Face model directory)");
}

// The only copy of a tensor's bytes: mapped file -> parameter (converting the dtype), in slices of about 64 MB along
// the first dimension, each released from the resident set as soon as it is copied. Peak memory while loading stays
// near the parameters' own size however large the embedding matrix is.
void copy_released(const SafetensorsFile& file, const SafetensorsEntry& entry, torch::Tensor& parameter) {
  constexpr uint64_t kSliceBytes = 64ull << 20;
  const torch::Tensor source = file.view(entry);
  const uint64_t bytes = entry.end - entry.begin;
  if (source.dim() == 0 || source.size(0) <= 1 || bytes <= kSliceBytes) {
    parameter.copy_(source);
    file.release(entry);
    return;
  }
  const uint64_t row_bytes = bytes / static_cast<uint64_t>(source.size(0));
  const int64_t rows_per_slice = std::max<int64_t>(1, static_cast<int64_t>(kSliceBytes / row_bytes));
  for (int64_t row = 0; row < source.size(0); row += rows_per_slice) {
    const int64_t rows = std::min(rows_per_slice, source.size(0) - row);
    parameter.narrow(0, row, rows).copy_(source.narrow(0, row, rows));
    file.release(entry, static_cast<uint64_t>(row) * row_bytes, static_cast<uint64_t>(row + rows) * row_bytes);
  }
}

// The name config.json gives a weights dtype (transformers' str(torch_dtype) without "torch.").
std::string config_dtype_name(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kHalf:
      return "float16";
    case torch::kDouble:
      return "float64";
    default:
      return "float32";
  }
}

// config.json as save_pretrained writes it. From the source directory: the file as it was, every field kept (a
// user's config carries fields this implementation never reads: use_cache, initializer_range, quantisation or
// architecture notes for other tools), only the dtype changed to the weights'. Without one: the model's Config.
nlohmann::json config_json(const Config& config, const std::string& dtype, const std::filesystem::path& source_dir) {
  const auto path = source_dir / "config.json";
  if (source_dir.empty() || !std::filesystem::exists(path)) {
    Config written = config;
    written.torch_dtype = dtype;
    return written.to_json();
  }
  nlohmann::json original = read_json_file(path);
  // Only the model's own config may be written beside its weights: one that disagrees (another checkpoint's
  // directory passed as the source) would make the checkpoint load as a different model, or not at all.
  nlohmann::json expected = config.to_json(), found = Config::from_json(original, path.string()).to_json();
  expected.erase("torch_dtype");
  found.erase("torch_dtype");
  for (const auto& [key, value] : expected.items()) {
    if (found.value(key, nlohmann::json()) != value) {
      throw std::invalid_argument(path.string() + ": field \"" + key + "\" is " +
                                  found.value(key, nlohmann::json()).dump() + " but the model being saved has " +
                                  value.dump() +
                                  "; SaveOptions::source_dir must be the directory the model was loaded from");
    }
  }
  bool had_dtype = false;
  for (const char* key : {"torch_dtype", "dtype"}) {  // transformers 4 writes the first, transformers 5 the second
    if (original.contains(key)) {
      original[key] = dtype;
      had_dtype = true;
    }
  }
  if (!had_dtype) original["torch_dtype"] = dtype;
  return original;
}

// generation_config.json for a model directory that has none: what transformers' GenerationConfig.from_model_config
// keeps of config.json (its special token ids), marked as derived from it. No "transformers_version": no transformers
// wrote it, and loaders take its absence for "unknown".
nlohmann::json generation_config_json(const nlohmann::json& config) {
  nlohmann::json generation{{"_from_model_config", true}};
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"}) {
    if (config.contains(key) && !config.at(key).is_null()) generation[key] = config.at(key);
  }
  return generation;
}

// Shards of at most max_bytes in parameter order, as huggingface_hub's split_torch_state_dict_into_shards makes them:
// a tensor that would tip the current shard over the limit starts the next one, and a tensor larger than the limit
// gets a shard of its own (placed before the shard being filled). max_bytes 0: everything in one.
std::vector<std::vector<std::pair<std::string, torch::Tensor>>> split_into_shards(
    const std::vector<std::pair<std::string, torch::Tensor>>& tensors, int64_t max_bytes) {
  if (max_bytes <= 0) return {tensors};
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> shards;
  std::vector<std::pair<std::string, torch::Tensor>> current;
  int64_t current_bytes = 0;
  for (const auto& item : tensors) {
    const int64_t bytes = item.second.numel() * item.second.element_size();
    if (bytes > max_bytes) {
      shards.push_back({item});
      continue;
    }
    if (current_bytes + bytes > max_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(item);
    current_bytes += bytes;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  if (shards.empty()) shards.emplace_back();  // a model without parameters still gets its (empty) file
  return shards;
}

// Weights files of an earlier save into `dir` that this save (writing `kept`) will not overwrite.
void remove_stale_weights(const std::filesystem::path& dir, const std::vector<std::string>& kept) {
  static const std::regex shard_name(R"(model-\d{5}-of-\d{5}\.safetensors)");
  const bool sharded = kept.size() > 1;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool weights = name == kSingleFile || name == kIndexFile || std::regex_match(name, shard_name);
    if (!weights || std::find(kept.begin(), kept.end(), name) != kept.end()) continue;
    if (name == kIndexFile && sharded) continue;  // rewritten below
    std::filesystem::remove(entry.path());
  }
}

}  // namespace

void load_weights(Qwen2ForCausalLM& model, const std::filesystem::path& dir, const LoadOptions& options) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> parameters;
  for (const auto& item : model->named_parameters()) parameters.emplace(item.key(), item.value());
  std::set<std::string> loaded;
  const auto started = std::chrono::steady_clock::now();
  const auto files = checkpoint_files(dir);
  uint64_t total_bytes = 0;
  std::size_t file_number = 0;
  for (const auto& [path, expected_names] : files) {
    const SafetensorsFile file = SafetensorsFile::open(path);
    const uint64_t file_bytes = std::filesystem::file_size(path);
    total_bytes += file_bytes;
    if (options.progress) {
      ++file_number;
      options.progress("loading weights" +
                       (files.size() > 1
                            ? " (" + std::to_string(file_number) + " of " + std::to_string(files.size()) + " files)"
                            : std::string()) +
                       ": " + path.filename().string() + ", " + size_text(file_bytes) + "...");
    }
    for (const auto& name : expected_names) {
      if (file.find(name) == nullptr) {
        throw std::runtime_error(path.string() + ": tensor \"" + name + "\" is listed in " + kIndexFile +
                                 " but missing from this shard");
      }
    }
    for (const auto& entry : file.entries()) {
      const auto parameter = parameters.find(entry.name);
      if (parameter == parameters.end()) {
        if (options.allow_unexpected) continue;
        throw std::runtime_error(path.string() + ": unexpected tensor \"" + entry.name + "\" (the model has no such " +
                                 "parameter" +
                                 (entry.name == "lm_head.weight" ? "; the config ties the embeddings" : "") +
                                 "; LoadOptions::allow_unexpected skips it)");
      }
      if (!loaded.insert(entry.name).second) {
        throw std::runtime_error(path.string() + ": tensor \"" + entry.name + "\" appears in more than one file");
      }
      if (entry.dtype != torch::kFloat32 && entry.dtype != torch::kBFloat16 && entry.dtype != torch::kFloat16) {
        throw std::runtime_error(path.string() + ": tensor \"" + entry.name + "\" has dtype " + entry.dtype_name +
                                 ", expected F32, BF16 or F16");
      }
      if (parameter->second.sizes() != torch::IntArrayRef(entry.shape)) {
        throw std::runtime_error(path.string() + ": tensor \"" + entry.name + "\" has shape " +
                                 dapo::shape_string(entry.shape) + " but the config makes it " +
                                 dapo::shape_string(parameter->second.sizes().vec()) +
                                 " (config.json and weights disagree)");
      }
      copy_released(file, entry, parameter->second);
    }
  }
  std::vector<std::string> missing;
  for (const auto& [name, parameter] : parameters) {
    if (!loaded.count(name)) missing.push_back(name);
  }
  if (!missing.empty()) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
    throw std::runtime_error(dir.string() + ": " + std::to_string(missing.size()) + " parameters missing from the " +
                             "checkpoint: " + list + (missing.size() > 5 ? ", ..." : ""));
  }
  if (options.progress) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    options.progress("loaded " + std::to_string(loaded.size()) + " tensors (" + size_text(total_bytes) + ") in " +
                     seconds + " s");
  }
}

Qwen2ForCausalLM load_model(const std::filesystem::path& dir, torch::ScalarType dtype, torch::Device device,
                            const LoadOptions& options) {
  const Config config = Config::from_file(dir / "config.json");
  Qwen2ForCausalLM model(config);
  model->to(device, dtype);
  load_weights(model, dir, options);
  return model;
}

void save_model(Qwen2ForCausalLM& model, const std::filesystem::path& dir, const SaveOptions& options) {
  std::filesystem::create_directories(dir);
  const auto parameters = model->named_parameters();
  const std::string dtype =
      config_dtype_name(parameters.size() > 0 ? parameters[0].value().scalar_type() : torch::kFloat32);
  const nlohmann::json config = config_json(model->config(), dtype, options.source_dir);
  write_file_atomically(dir / "config.json", config.dump(2) + "\n");
  const auto source_generation = options.source_dir / kGenerationConfig;
  if (!options.source_dir.empty() && std::filesystem::exists(source_generation)) {
    write_file_atomically(dir / kGenerationConfig, read_text_file(source_generation));
  } else {
    write_file_atomically(dir / kGenerationConfig, generation_config_json(config).dump(2) + "\n");
  }

  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : parameters) tensors.emplace_back(item.key(), item.value());
  const auto shards = split_into_shards(tensors, options.max_shard_bytes);
  std::vector<std::string> names;
  if (shards.size() == 1) {
    names.push_back(kSingleFile);
  } else {
    char name[64];
    for (std::size_t i = 0; i < shards.size(); ++i) {
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      names.push_back(name);
    }
  }
  remove_stale_weights(dir, names);

  const std::map<std::string, std::string> metadata{{"format", "pt"}};  // what transformers writes
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total_parameters = 0, total_size = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    int64_t shard_bytes = 0;
    for (const auto& [tensor_name, tensor] : shards[i]) {
      shard_bytes += tensor.numel() * tensor.element_size();
      total_parameters += tensor.numel();
      weight_map[tensor_name] = names[i];
    }
    total_size += shard_bytes;
    if (options.progress) {
      options.progress("writing weights" +
                       (shards.size() > 1
                            ? " (" + std::to_string(i + 1) + " of " + std::to_string(shards.size()) + " shards)"
                            : std::string()) +
                       ": " + names[i] + ", " + size_text(static_cast<uint64_t>(shard_bytes)) + "...");
    }
    write_safetensors(dir / names[i], shards[i], metadata);
  }
  if (shards.size() > 1) {
    // As transformers writes it (json.dumps(index, indent=2, sort_keys=True); recent versions add total_parameters),
    // last, so that an index never names a shard not yet written.
    const nlohmann::json index{{"metadata", {{"total_parameters", total_parameters}, {"total_size", total_size}}},
                               {"weight_map", weight_map}};
    write_file_atomically(dir / kIndexFile, index.dump(2) + "\n");
  }
}

void initialize_weights(Qwen2ForCausalLM& model, double std) {
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& parameter = item.value();
    if (name.ends_with("norm.weight")) {
      parameter.fill_(1.0);
    } else if (name.ends_with(".bias")) {
      parameter.zero_();
    } else {
      parameter.normal_(0.0, std);
    }
  }
}

Qwen2ForCausalLM random_model(const Config& config, uint64_t seed, torch::Device device, torch::ScalarType dtype) {
  torch::manual_seed(seed);  // seeds the CPU's and every GPU's generator
  Qwen2ForCausalLM model(config);
  model->to(device);
  initialize_weights(model);
  if (dtype != torch::kFloat32) model->to(dtype);
  return model;
}

}  // namespace qwen
