// safetensors: exact round trips, and every malformed file producing its own error (never a crash).
#include <torch/torch.h>

#include <fstream>

#include "qwen_gsm8k/model/safetensors.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file with the given header JSON and data bytes.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  const uint64_t length = header.size();
  std::string bytes(reinterpret_cast<const char*>(&length), 8);
  return bytes + header + data;
}

}  // namespace

TEST_CASE("safetensors round trip is exact for F32, BF16, F16 and I64, with metadata") {
  dapo::test::ScratchDir scratch;
  const auto path = scratch.path() / "t.safetensors";
  const torch::Tensor f32 = torch::randn({3, 5}), bf16 = torch::randn({7}).to(torch::kBFloat16);
  const torch::Tensor f16 = torch::randn({2, 2, 2}).to(torch::kHalf), i64 = torch::arange(6, torch::kInt64);
  qwen::write_safetensors(path, {{"a", f32}, {"b.weight", bf16}, {"c", f16}, {"d", i64}, {"e", torch::zeros({0, 4})}},
                          {{"format", "pt"}});
  const auto file = qwen::SafetensorsFile::open(path);
  CHECK(file.entries().size() == 5);
  CHECK(file.metadata().at("format") == "pt");
  CHECK(torch::equal(file.view(*file.find("a")), f32));
  CHECK(torch::equal(file.view(*file.find("b.weight")), bf16));
  CHECK(torch::equal(file.view(*file.find("c")), f16));
  CHECK(torch::equal(file.view(*file.find("d")), i64));
  CHECK(file.view(*file.find("e")).numel() == 0);
  CHECK(file.find("missing") == nullptr);
  CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp"));
}

TEST_CASE("malformed safetensors files each produce the intended error") {
  dapo::test::ScratchDir scratch;
  const auto path = scratch.path() / "bad.safetensors";
  auto error_of = [&](const std::string& bytes) {
    write_bytes(path, bytes);
    try {
      qwen::SafetensorsFile::open(path);
    } catch (const std::runtime_error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  const std::string good_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK(error_of(safetensors_bytes(good_header, std::string(8, '\0'))) == "no error");

  CHECK(error_of("abc").find("too short for the 8-byte header length") != std::string::npos);
  CHECK(error_of(safetensors_bytes(good_header, std::string(8, '\0')).substr(0, 20)).find("exceeds the file size") !=
        std::string::npos);
  CHECK(error_of(safetensors_bytes("{not json", "")).find("header is not valid JSON at byte") != std::string::npos);
  CHECK(error_of(safetensors_bytes("[1,2]", "")).find("header is not a JSON object") != std::string::npos);
  CHECK(error_of(safetensors_bytes(good_header, std::string(4, '\0')))
            .find("tensor \"w\": data_offsets [0, 8] fall outside the data section of 4 bytes") != std::string::npos);
  CHECK(error_of(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')))
            .find("8 bytes for shape [3] of F32, expected 12") != std::string::npos);
  CHECK(error_of(safetensors_bytes(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')))
            .find("unknown dtype \"Q4\"") != std::string::npos);
  CHECK(error_of(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')))
            .find("shape holds -2") != std::string::npos);
  CHECK(error_of(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2]}})", std::string(8, '\0')))
            .find("lacks dtype, shape or data_offsets") != std::string::npos);
  CHECK(error_of(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                   std::string(12, '\0')))
            .find("tensors overlap at data offset 4") != std::string::npos);
  CHECK(error_of(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, '\0')))
            .find("fall outside the data section") != std::string::npos);
  const std::string missing = (scratch.path() / "none.safetensors").string();
  CHECK_THROWS_WITH_AS(qwen::SafetensorsFile::open(missing), doctest::Contains("cannot open"), std::runtime_error);
}

TEST_CASE("checkpoint loading names the file and tensor for truncation, wrong shapes, missing and unexpected tensors") {
  const auto fixture = dapo::test::qwen_fixture("tiny-tied-f32");
  if (!fixture) return;
  auto copy_fixture = [&](const std::filesystem::path& to) {
    std::filesystem::create_directories(to);
    std::filesystem::copy_file(*fixture / "config.json", to / "config.json");
    std::filesystem::copy_file(*fixture / "model.safetensors", to / "model.safetensors");
  };
  auto load_error = [](const std::filesystem::path& dir) {
    try {
      qwen::load_model(dir);
    } catch (const std::exception& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  {  // truncated weights file
    dapo::test::ScratchDir scratch;
    copy_fixture(scratch.path());
    const std::string bytes = read_bytes(scratch.path() / "model.safetensors");
    write_bytes(scratch.path() / "model.safetensors", bytes.substr(0, bytes.size() - 1000));
    const std::string error = load_error(scratch.path());
    CHECK(error.find("model.safetensors") != std::string::npos);
    CHECK(error.find("fall outside the data section") != std::string::npos);
  }
  {  // the config says hidden 32: every shape disagrees
    dapo::test::ScratchDir scratch;
    copy_fixture(scratch.path());
    auto config = dapo::test::read_json(scratch.path() / "config.json");
    config["intermediate_size"] = 96;
    std::ofstream(scratch.path() / "config.json") << config.dump();
    CHECK(load_error(scratch.path())
              .find("tensor \"model.layers.0.mlp.down_proj.weight\" has shape [64, 160] but the config makes it [64, "
                    "96]") != std::string::npos);
  }
  {  // a tensor missing, and an unexpected one (lm_head.weight in a tied model)
    dapo::test::ScratchDir scratch;
    auto model = qwen::load_model(*fixture);
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    for (const auto& item : model->named_parameters()) {
      if (item.key() != "model.norm.weight") tensors.emplace_back(item.key(), item.value());
    }
    std::filesystem::copy_file(*fixture / "config.json", scratch.path() / "config.json");
    qwen::write_safetensors(scratch.path() / "model.safetensors", tensors);
    CHECK(load_error(scratch.path()).find("1 parameters missing from the checkpoint: model.norm.weight") !=
          std::string::npos);
    tensors.emplace_back("model.norm.weight", model->model->norm->weight);
    tensors.emplace_back("lm_head.weight", model->lm_head_weight());
    qwen::write_safetensors(scratch.path() / "model.safetensors", tensors);
    CHECK(load_error(scratch.path()).find("unexpected tensor \"lm_head.weight\"") != std::string::npos);
    CHECK_NOTHROW(qwen::load_model(scratch.path(), torch::kFloat32, torch::kCPU, {.allow_unexpected = true}));
  }
  {  // no weights at all
    dapo::test::ScratchDir scratch;
    std::filesystem::copy_file(*fixture / "config.json", scratch.path() / "config.json");
    CHECK(load_error(scratch.path()).find("no model.safetensors and no model.safetensors.index.json") !=
          std::string::npos);
  }
}
