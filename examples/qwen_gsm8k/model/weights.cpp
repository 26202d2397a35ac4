// Loading and saving weights in the Hugging Face layout (single file or sharded), checked against the model.
#include "qwen_gsm8k/model/weights.hpp"

#include <dapo/core/error.hpp>

#include <fstream>
#include <map>
#include <set>
#include <stdexcept>

#include "qwen_gsm8k/common/atomic_file.hpp"
#include "qwen_gsm8k/model/safetensors.hpp"

namespace qwen {
namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// The safetensors files of a checkpoint directory, with the tensors each should hold (empty: whatever it holds).
std::map<std::filesystem::path, std::set<std::string>> checkpoint_files(const std::filesystem::path& dir) {
  std::map<std::filesystem::path, std::set<std::string>> files;
  const auto index_path = dir / kIndexFile;
  if (std::filesystem::exists(index_path)) {
    std::ifstream in(index_path);
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::parse_error& error) {
      throw std::runtime_error(index_path.string() + ": invalid JSON at byte " + std::to_string(error.byte));
    }
    if (!index.contains("weight_map") || !index.at("weight_map").is_object()) {
      throw std::runtime_error(index_path.string() + ": no \"weight_map\" object");
    }
    for (const auto& [name, file] : index.at("weight_map").items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
        throw std::runtime_error(index_path.string() + ": weight_map[\"" + name + "\"] is " + file.dump() +
                                 ", expected a file name in the same directory");
      }
      files[dir / file.get<std::string>()].insert(name);
    }
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

}  // namespace

void load_weights(Qwen2ForCausalLM& model, const std::filesystem::path& dir, const LoadOptions& options) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> parameters;
  for (const auto& item : model->named_parameters()) parameters.emplace(item.key(), item.value());
  std::set<std::string> loaded;
  for (const auto& [path, expected_names] : checkpoint_files(dir)) {
    const SafetensorsFile file = SafetensorsFile::open(path);
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
  Config config = model->config();
  const auto parameters = model->named_parameters();
  if (parameters.size() > 0) {
    config.torch_dtype = parameters[0].value().scalar_type() == torch::kBFloat16 ? "bfloat16"
                         : parameters[0].value().scalar_type() == torch::kHalf   ? "float16"
                                                                                 : "float32";
  }
  write_file_atomically(dir / "config.json", config.to_json().dump(2) + "\n");

  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> shards(1);
  int64_t shard_bytes = 0, total_bytes = 0;
  for (const auto& item : parameters) {
    const int64_t bytes = item.value().numel() * item.value().element_size();
    if (options.max_shard_bytes > 0 && shard_bytes > 0 && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(item.key(), item.value());
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  if (options.max_shard_bytes <= 0) {
    write_safetensors(dir / kSingleFile, shards.front(), metadata);
    return;
  }
  nlohmann::json index{{"metadata", {{"total_size", total_bytes}}}, {"weight_map", nlohmann::json::object()}};
  char name[64];
  for (std::size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors(dir / name, shards[i], metadata);
    for (const auto& [tensor_name, tensor] : shards[i]) index["weight_map"][tensor_name] = name;
  }
  write_file_atomically(dir / kIndexFile, index.dump(2) + "\n");
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

}  // namespace qwen
