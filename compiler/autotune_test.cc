// Autotuning persisted in the compile cache. CPU: a table tuned with a fake timing function is
// stored, read back by a real second process that times nothing, and not used for another device
// model (which tunes again). GPU: a compiled step with autotuning computes what the untuned step
// computes, tunes its GEMMs in the warm-up step, and a "restarted" compile times nothing.
#include "compiler/autotune.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compiler/testing/tiny_llama.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/shipped_tuning.h"

namespace sg::compiler {
namespace {

namespace at = kernels::autotune;

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name, "_", ::getpid(), "_", sg::testing::Rng()());
  EXPECT_EQ(::mkdir(dir.c_str(), 0755), 0) << dir;
  return dir;
}

at::TuningKey Key(const std::string& device, int i) {
  return {"gemm.cublaslt", device, "cublasLt 130000", absl::StrCat("m=", 1024 * (i + 1), ",n=2048,k=2048")};
}

// A tuning with a fake timing function: candidate i takes times[i] microseconds.
at::Tuner::TuneFn FakeTuning(const std::vector<double>& times, int* calls) {
  return [times, calls]() -> absl::StatusOr<at::Choice> {
    ++*calls;
    return at::PickFastest(
        int(times.size()), [&](int i) -> absl::StatusOr<double> { return times[size_t(i)]; },
        [](int i) { return std::string("algo\0", 5) + char('A' + i); });
  };
}

// Waits for a forked child with a deadline; true when it exited 0.
bool ChildSucceeded(pid_t pid) {
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "child process timed out";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(TuningStore, SecondProcessReusesTheStoredTableWithoutTiming) {
  const std::string dir = FreshDir("tuning");
  const std::string gpu = "NVIDIA H200";
  std::vector<std::vector<double>> times(3);
  for (auto& t : times) {
    for (int i = 0; i < 5; ++i) t.push_back(10.0 + double(sg::testing::Rng()() % 1000));
  }
  std::vector<std::string> chosen;
  {
    at::Tuner tuner;
    absl::StatusOr<TuningStore> store = TuningStore::Open(dir, gpu);
    ASSERT_TRUE(store.ok()) << store.status();
    absl::StatusOr<size_t> loaded = store->Load(tuner);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(*loaded, 0u) << "a fresh directory holds no table";
    int calls = 0;
    for (int k = 0; k < 3; ++k) {
      absl::StatusOr<at::Choice> c = tuner.GetOrTune(Key(gpu, k), FakeTuning(times[size_t(k)], &calls));
      ASSERT_TRUE(c.ok()) << c.status();
      const int best = int(std::min_element(times[size_t(k)].begin(), times[size_t(k)].end()) - times[size_t(k)].begin());
      EXPECT_EQ(c->variant, std::string("algo\0", 5) + char('A' + best));
      chosen.push_back(c->variant);
    }
    EXPECT_EQ(calls, 3);
    ASSERT_TRUE(store->Save(tuner).ok());
  }
  // A real second process: it loads the table and every lookup is answered without timing.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    at::Tuner tuner;
    absl::StatusOr<TuningStore> store = TuningStore::Open(dir, gpu);
    if (!store.ok() || store->Load(tuner).value_or(0) != 3) ::_exit(2);
    for (int k = 0; k < 3; ++k) {
      absl::StatusOr<at::Choice> c = tuner.GetOrTune(Key(gpu, k), []() -> absl::StatusOr<at::Choice> {
        return absl::InternalError("timed again");
      });
      if (!c.ok() || c->variant != chosen[size_t(k)]) ::_exit(3);
    }
    ::_exit(tuner.tunings() == 0 ? 0 : 4);
  }
  EXPECT_TRUE(ChildSucceeded(pid)) << "the second process did not reuse the stored choices";
}

TEST(TuningStore, AnotherDeviceModelTunesAgainAndBothTablesSurvive) {
  const std::string dir = FreshDir("tuning_models");
  const std::vector<double> times = {30, 20, 10, 40};
  int calls = 0;
  {
    at::Tuner tuner;
    TuningStore store = TuningStore::Open(dir, "NVIDIA H200").value();
    ASSERT_TRUE(store.Load(tuner).ok());
    ASSERT_TRUE(tuner.GetOrTune(Key("NVIDIA H200", 0), FakeTuning(times, &calls)).ok());
    ASSERT_TRUE(store.Save(tuner).ok());
  }
  {
    // Same problem, another GPU model: its table is empty, and the H200 choice is not used.
    at::Tuner tuner;
    TuningStore store = TuningStore::Open(dir, "NVIDIA A100-SXM4-80GB").value();
    EXPECT_EQ(store.Load(tuner).value(), 0u);
    const int before = calls;
    ASSERT_TRUE(tuner.GetOrTune(Key("NVIDIA A100-SXM4-80GB", 0), FakeTuning(times, &calls)).ok());
    EXPECT_EQ(calls, before + 1) << "a different device model must tune again";
    ASSERT_TRUE(store.Save(tuner).ok());
  }
  {
    at::Tuner tuner;
    EXPECT_EQ(TuningStore::Open(dir, "NVIDIA H200").value().Load(tuner).value(), 1u);
    EXPECT_TRUE(tuner.Find(Key("NVIDIA H200", 0)).has_value());
    EXPECT_FALSE(tuner.Find(Key("NVIDIA A100-SXM4-80GB", 0)).has_value());
  }
}

TEST(TuningStore, SaveKeepsWhatAnotherProcessStoredAndSkipsWhenNothingIsNew) {
  const std::string dir = FreshDir("tuning_merge");
  const std::string gpu = "NVIDIA H200";
  int calls = 0;
  at::Tuner a, b;
  TuningStore sa = TuningStore::Open(dir, gpu).value(), sb = TuningStore::Open(dir, gpu).value();
  ASSERT_TRUE(sa.Load(a).ok());
  ASSERT_TRUE(sb.Load(b).ok());
  ASSERT_TRUE(a.GetOrTune(Key(gpu, 0), FakeTuning({2, 1}, &calls)).ok());
  ASSERT_TRUE(b.GetOrTune(Key(gpu, 1), FakeTuning({1, 2}, &calls)).ok());
  ASSERT_TRUE(sa.Save(a).ok());
  ASSERT_TRUE(sb.Save(b).ok());  // b never saw a's choice, and must not drop it
  at::Tuner c;
  EXPECT_EQ(TuningStore::Open(dir, gpu).value().Load(c).value(), 2u);
  EXPECT_TRUE(AutotuneEnabled([] {
    CompileOptions o;
    o.device = Device::Cuda(0);
    return o;
  }()) == at::AutotuneAllowedByEnv());
  CompileOptions cpu;
  EXPECT_FALSE(AutotuneEnabled(cpu)) << "the CPU has nothing to tune";
}

// GPU: a tiny Llama step (bf16 mixed precision) compiled with autotuning gives the untuned step's
// loss and gradients; its warm-up step tunes the GEMMs and stores them; a "restarted" compile
// (the tuner's and the GEMM's in-process choices forgotten) loads them and times nothing.
TEST(AutotuneCuda, TunedStepMatchesUntunedAndRestartTimesNothing) {
  SG_SKIP_WITHOUT_CUDA();
  testing::TinyLlamaConfig c;
  c.vocab = 64;
  c.dim = 128;
  c.heads = 2;
  c.kv_heads = 1;
  c.ffn = 256;
  graph::Graph forward = testing::TinyLlama(c).value();
  graph::Feeds params = testing::RandomParameters(forward, sg::testing::Rng());
  for (auto& [name, h] : params) {
    if (h.shape.size() == 2) {
      for (double& v : h.data) v *= 0.1;
    }
  }
  graph::Feeds batch = testing::RandomBatch(2, 8, c.vocab, sg::testing::Rng());
  std::map<std::string, Tensor> batch_t;
  std::map<std::string, TensorView> batch_v;
  for (const auto& [k, h] : batch) {
    batch_t[k] = sg::testing::FromHost(h.data, h.shape, h.dtype, Device::Cpu());
    batch_v[k] = batch_t[k].view();
  }
  const std::string dir = FreshDir("autotune_cuda");
  at::Tuner& tuner = at::Tuner::Global();
  auto run = [&](bool autotune, std::vector<std::vector<double>>* grads) -> float {
    CompileOptions o;
    o.device = Device::Cuda(0);
    o.precision = Precision::kBF16Mixed;
    o.binding = {{"batch", 2}, {"seq", 8}};
    o.cache_dir = dir;
    o.autotune = autotune;
    auto step = Compile(forward, o);
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return 0;
    for (const auto& [name, h] : params) {
      EXPECT_TRUE((*step)->Write(name, sg::testing::FromHost(h.data, h.shape, h.dtype, Device::Cpu())).ok());
    }
    EXPECT_TRUE((*step)->Run(batch_v).ok());
    auto m = (*step)->ReadMetrics();
    EXPECT_TRUE(m.ok()) << m.status();
    for (const std::string& name : (*step)->parameter_names()) {
      EXPECT_TRUE((*step)->executor().Synchronize().ok());
      grads->push_back(sg::testing::ToHost((*step)->View("grad:" + name).value()));
    }
    return m.ok() ? m->loss : 0;
  };
  ::unsetenv("SG_AUTOTUNE");
  tuner.set_enabled(false);
  std::vector<std::vector<double>> plain, tuned, restarted;
  const float loss_plain = run(false, &plain);
  const int64_t before = tuner.tunings();
  const float loss_tuned = run(true, &tuned);
  EXPECT_GT(tuner.tunings(), before) << "the warm-up step should have tuned the step's GEMMs";
  std::cout << "GEMM problems tuned: " << tuner.tunings() - before << "\n";

  tuner.Clear();
  kernels::ResetGemmAlgorithmCache();
  const float loss_restarted = run(true, &restarted);
  EXPECT_EQ(tuner.tunings(), 0) << "the restarted compile must reuse the stored choices";

  EXPECT_NEAR(loss_tuned, loss_plain, 1e-3 * std::abs(loss_plain));
  EXPECT_NEAR(loss_restarted, loss_plain, 1e-3 * std::abs(loss_plain));
  ASSERT_EQ(plain.size(), tuned.size());
  ASSERT_EQ(plain.size(), restarted.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_LT(sg::testing::RelativeError(tuned[i], plain[i]), 2e-2) << i;
    EXPECT_LT(sg::testing::RelativeError(restarted[i], plain[i]), 2e-2) << i;
  }
}

// GPU: StartAutotune installs the shipped GEMM choices with shipped_tuning, after the compile
// cache's (a cached choice for the same key wins), and not without it.
TEST(AutotuneCuda, StartAutotuneInstallsTheShippedChoicesAfterTheCaches) {
  SG_SKIP_WITHOUT_CUDA();
  absl::StatusOr<at::TuningTable> shipped = kernels::ShippedGemmTuning();
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  ASSERT_GT(shipped->size(), 1u);
  ::unsetenv("SG_AUTOTUNE");
  at::Tuner& tuner = at::Tuner::Global();
  const auto first = shipped->entries().begin();
  CompileOptions o;
  o.device = Device::Cuda(0);
  o.shipped_tuning = false;
  tuner.Clear();
  ASSERT_TRUE(StartAutotune(o).ok());
  EXPECT_FALSE(tuner.Find(first->first).has_value());

  // A cache holding its own choice for the first shipped key (under the shipped device name; the
  // store is keyed by this GPU's model, so the entry is put there directly).
  tuner.Clear();
  at::Choice mine(std::string(64, '\x5a'), 1.0, 1);
  tuner.Install([&] {
    at::TuningTable t;
    t.Put(first->first, mine);
    return t;
  }());
  o.shipped_tuning = true;
  ASSERT_TRUE(StartAutotune(o).ok());
  EXPECT_EQ(*tuner.Find(first->first), mine);
  for (auto it = std::next(first); it != shipped->entries().end(); ++it) {
    std::optional<at::Choice> c = tuner.Find(it->first);
    ASSERT_TRUE(c.has_value()) << it->first.problem;
    EXPECT_EQ(*c, it->second);
  }
  tuner.Clear();
}

}  // namespace
}  // namespace sg::compiler
