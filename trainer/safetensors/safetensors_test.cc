#include "trainer/safetensors/safetensors.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "nlohmann/json.hpp"
#include "trainer/io/file_io.h"

namespace sg::trainer {
namespace {

using nlohmann::json;

std::string TmpPath(const std::string& name) {
  return JoinPath(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp", name);
}

std::string FixtureScript() {
  return JoinPath(JoinPath(std::getenv("TEST_SRCDIR"), std::getenv("TEST_WORKSPACE")),
                  "trainer/safetensors/safetensors_fixture.py");
}

// Runs the independent Python writer/reader; returns its stdout.
std::string RunPython(const std::string& args) {
  const std::string cmd = "python3 " + FixtureScript() + " " + args;
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr) << cmd;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << cmd;
  return out;
}

// Element i of a host tensor as the integer bit pattern the Python side uses.
int64_t Bits(const TensorView& t, int64_t i) {
  const char* p = static_cast<const char*>(t.raw()) + i * SizeOf(t.dtype());
  switch (t.dtype()) {
    case DType::kF32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::kBF16:
    case DType::kF16: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case DType::kI32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::kI64: { int64_t v; std::memcpy(&v, p, 8); return v; }
  }
  return 0;
}

Shape ShapeOf(const json& j) {
  Shape s;
  for (const json& d : j) s.push_back(d.get<int64_t>());
  return s;
}

// Checks `tensors` (name -> tensor) against the Python side's {"tensors": {name: {dtype, shape, bits}}}.
void ExpectMatchesPython(const std::vector<NamedTensor>& tensors, const json& want) {
  ASSERT_EQ(tensors.size(), want["tensors"].size());
  for (const NamedTensor& t : tensors) {
    ASSERT_TRUE(want["tensors"].contains(t.name)) << t.name;
    const json& w = want["tensors"][t.name];
    EXPECT_EQ(SafetensorsDTypeName(t.tensor.dtype()), w["dtype"].get<std::string>()) << t.name;
    EXPECT_EQ(t.tensor.shape(), ShapeOf(w["shape"])) << t.name;
    ASSERT_EQ(t.tensor.numel(), int64_t(w["bits"].size())) << t.name;
    for (int64_t i = 0; i < t.tensor.numel(); ++i) {
      ASSERT_EQ(Bits(t.tensor.view(), i), w["bits"][i].get<int64_t>()) << t.name << "[" << i << "]";
    }
  }
}

TEST(SafetensorsTest, ReadsAFileFromAnIndependentPythonWriter) {
  const std::string path = TmpPath("python.safetensors");
  const uint64_t seed = testing::Rng()() % 1000000;
  RunPython("write " + path + " " + std::to_string(seed));
  auto want = ReadFile(path + ".json");
  ASSERT_TRUE(want.ok()) << want.status();
  const json expected = json::parse(*want);

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("seed"), std::to_string(seed));
  auto all = f->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  ExpectMatchesPython(*all, expected);
  bool has_empty = false;
  for (const NamedTensor& t : *all) has_empty |= t.tensor.numel() == 0;
  EXPECT_TRUE(has_empty);
}

std::vector<NamedTensor> RandomTensors(std::mt19937_64& rng) {
  std::vector<NamedTensor> out;
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64};
  for (int i = 0; i < 12; ++i) {
    const DType dt = dtypes[rng() % 5];
    Shape shape;
    for (int r = int(rng() % 4); r > 0; --r) shape.push_back(1 + int64_t(rng() % 9));
    Tensor t;
    if (IsFloating(dt)) {
      t = testing::RandomTensor(shape, dt, Device::Cpu(), rng, 3.0f);
    } else {
      t = *Tensor::Empty(shape, dt, Device::Cpu());
      for (int64_t b = 0; b < t.nbytes(); ++b) static_cast<uint8_t*>(t.view().raw())[b] = uint8_t(rng());
    }
    out.push_back({"layer." + std::to_string(i) + ".w", t});
  }
  return out;
}

TEST(SafetensorsTest, RoundTripsAndAnIndependentReaderAgrees) {
  auto& rng = testing::Rng();
  const std::vector<NamedTensor> tensors = RandomTensors(rng);
  std::vector<NamedTensorView> views;
  for (const NamedTensor& t : tensors) views.push_back({t.name, t.tensor.view()});
  const std::string path = TmpPath("roundtrip.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, views, {{"format", "pt"}, {"step", "17"}}).ok());

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->metadata().at("step"), "17");
  ASSERT_EQ(f->entries().size(), tensors.size());
  for (const NamedTensor& t : tensors) {
    auto back = f->Load(t.name);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->dtype(), t.tensor.dtype());
    EXPECT_EQ(back->shape(), t.tensor.shape());
    EXPECT_EQ(std::memcmp(back->view().raw(), t.tensor.view().raw(), size_t(t.tensor.nbytes())), 0) << t.name;
  }
  // Header length is a multiple of 8, as Hugging Face's writer makes it.
  auto raw = ReadFile(path);
  ASSERT_TRUE(raw.ok());
  uint64_t n;
  std::memcpy(&n, raw->data(), 8);
  EXPECT_EQ(n % 8, 0u);

  const json dumped = json::parse(RunPython("dump " + path));
  EXPECT_EQ(dumped["metadata"]["step"], "17");
  ExpectMatchesPython(tensors, dumped);

  auto missing = f->Load("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no tensor 'nope'"), std::string::npos);
}

TEST(SafetensorsTest, WriterRefusesBadArguments) {
  Tensor t = testing::RandomTensor({2, 2}, DType::kF32, Device::Cpu(), testing::Rng());
  const std::string path = TmpPath("bad_args.safetensors");
  absl::Status dup = WriteSafetensors(path, {{"a", t.view()}, {"a", t.view()}});
  EXPECT_NE(dup.message().find("'a' appears twice"), std::string::npos) << dup;
  absl::Status reserved = WriteSafetensors(path, {{"__metadata__", t.view()}});
  EXPECT_NE(reserved.message().find("reserved"), std::string::npos) << reserved;
  EXPECT_FALSE(ReadFile(path).ok());  // nothing was written
}

// A file with the given header text (length prefix computed) and `data_bytes` bytes of data.
std::string MakeFile(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\x11');
}

TEST(SafetensorsTest, CorruptFilesAreRefusedWithTheReason) {
  const std::string entry_a = R"("a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]})";
  struct Case {
    std::string name, bytes, want;
  };
  std::string huge_len = MakeFile("{}", 0);
  huge_len[7] = '\x7f';
  std::string past_file = MakeFile("{" + entry_a + "}", 24);
  past_file[0] = char(past_file[0] + 100);
  const std::vector<Case> cases = {
      {"short", "abc", "expected at least 8 bytes"},
      {"huge_header_len", huge_len, "header length"},
      {"header_past_file", past_file, "header length"},
      {"not_json", MakeFile("{\"a\": [1, 2", 0), "not valid JSON"},
      {"not_object", MakeFile("[1, 2, 3]", 0), "must start with '{'"},
      {"bad_dtype", MakeFile(R"({"a": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8),
       "expected one of F32, BF16, F16, I32, I64, found \"F64\""},
      {"negative_dim", MakeFile(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
       "non-negative"},
      {"size_mismatch", MakeFile(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8),
       "span 8 bytes, expected 12"},
      {"offsets_reversed", MakeFile(R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 8),
       "'data_offsets'"},
      {"overlap", MakeFile("{" + entry_a + R"(, "b": {"dtype": "I32", "shape": [2], "data_offsets": [20, 28]}})", 28),
       "overlap"},
      {"hole", MakeFile("{" + entry_a + R"(, "b": {"dtype": "I32", "shape": [2], "data_offsets": [28, 36]}})", 36),
       "leave a hole"},
      {"truncated", MakeFile("{" + entry_a + "}", 20), "past the end of the data section (20 bytes)"},
      {"trailing", MakeFile("{" + entry_a + "}", 30), "data section has 30 bytes, expected 24"},
      {"metadata_type", MakeFile(R"({"__metadata__": {"step": 3}})", 0), "expected a string, found 3"},
      {"extra_field", MakeFile(R"({"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4], "x": 1}})", 4),
       "unexpected field 'x'"},
      {"overflow", MakeFile(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4),
       "more bytes than fit"},
  };
  for (const Case& c : cases) {
    const std::string path = TmpPath("corrupt_" + c.name + ".safetensors");
    ASSERT_TRUE(WriteFileAtomic(path, c.bytes).ok());
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << c.name;
    const std::string msg(f.status().message());
    EXPECT_NE(msg.find(path), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.want), std::string::npos) << c.name << ": want '" << c.want << "' in: " << msg;
    if (c.name == "overlap" || c.name == "hole") {
      EXPECT_NE(msg.find("'b'"), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(SafetensorsFile::Open(TmpPath("absent.safetensors")).status().code(), absl::StatusCode::kNotFound);
}

// Random byte flips in a real file's header: each either opens (and then every tensor loads) or is
// refused with a message; none may crash.
TEST(SafetensorsTest, FlippedHeaderBytesNeverCrash) {
  auto& rng = testing::Rng();
  std::vector<NamedTensor> tensors = RandomTensors(rng);
  std::vector<NamedTensorView> views;
  for (const NamedTensor& t : tensors) views.push_back({t.name, t.tensor.view()});
  const std::string good = TmpPath("good.safetensors");
  ASSERT_TRUE(WriteSafetensors(good, views).ok());
  const std::string bytes = *ReadFile(good);
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  int refused = 0;
  for (int i = 0; i < 300; ++i) {
    std::string mutated = bytes;
    const size_t at = size_t(rng() % (8 + header_len));
    mutated[at] = char(rng());
    const std::string path = TmpPath("mutated.safetensors");
    ASSERT_TRUE(WriteFileAtomic(path, mutated).ok());
    auto f = SafetensorsFile::Open(path);
    if (!f.ok()) {
      ++refused;
      EXPECT_FALSE(f.status().message().empty());
      continue;
    }
    EXPECT_TRUE(f->LoadAll().ok());
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace sg::trainer
