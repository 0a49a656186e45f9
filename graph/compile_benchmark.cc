// Compile-time benchmarks of the graph layer (CPU only):
//   BM_ColdCompileLlama1B   capture + fwd/bwd/AdamW + passes + memory plan of Llama-1B (goal < 1 s)
//   BM_WarmHitMemory        cache lookup served from memory (goal < 1 ms)
//   BM_WarmHitDisk          lookup from a fresh cache object, served from disk (goal < 20 ms)
//   BM_HitRateTrace/<mode>  1,000 steps with varying batch/seq; counters hit_rate and compiles
//                           (goal >= 99% for static, one symbolic dim, several symbolic dims).
// Run: ./bazelw run -c opt //graph:compile_benchmark
#include <unistd.h>

#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "graph/cache.h"
#include "graph/models/llama.h"
#include "graph/pipeline.h"

namespace sg::graph {
namespace {

const Graph& Llama1BForward() {
  static const Graph* g = new Graph(BuildLlamaForward(LlamaConfig::Llama1B()).value());
  return *g;
}

std::string TempDir(const std::string& name) {
  std::string dir = absl::StrCat("/tmp/sg_compile_benchmark_", name, "_", ::getpid());
  return dir;
}

std::unique_ptr<CompileCache> Open(const std::string& dir) {
  CompileCache::Options o;
  o.dir = dir;
  return CompileCache::Open(o).value();
}

void BM_ColdCompileLlama1B(benchmark::State& state) {
  const LlamaConfig c = LlamaConfig::Llama1B();
  PipelineOptions po;
  size_t nodes = 0, text = 0;
  for (auto _ : state) {
    Graph fwd = BuildLlamaForward(c).value();
    Specialization spec = Specialization::Make(fwd.symbols(), {}, {{"batch", 8}, {"seq", 2048}}).value();
    Artifact a = CompileTrainStep(fwd, po, spec).value();
    text = a.graph_text.size();
    benchmark::DoNotOptimize(a);
  }
  nodes = OptimizeTrainStep(Llama1BForward(), po).value().nodes().size();
  state.counters["nodes"] = double(nodes);
  state.counters["text_bytes"] = double(text);
}
BENCHMARK(BM_ColdCompileLlama1B)->Unit(benchmark::kMillisecond);

CompileCache::CompileFn Compiler(const Graph& fwd, const PipelineOptions& po) {
  return [&fwd, po](const Specialization& s) { return CompileTrainStep(fwd, po, s); };
}

void BM_WarmHitMemory(benchmark::State& state) {
  PipelineOptions po;
  auto cache = Open("");
  CacheRequest req = CacheRequest::For(Llama1BForward());  // fingerprint computed once per graph
  req.options = po.CacheOptions();
  const Binding b = {{"batch", 8}, {"seq", 2048}};
  (void)cache->GetOrCompile(req, b, Compiler(Llama1BForward(), po)).value();
  for (auto _ : state) {
    benchmark::DoNotOptimize(cache->GetOrCompile(req, b, Compiler(Llama1BForward(), po)).value());
  }
  state.counters["hit_rate"] = cache->stats().hit_rate();
}
BENCHMARK(BM_WarmHitMemory)->Unit(benchmark::kMicrosecond);

void BM_WarmHitDisk(benchmark::State& state) {
  PipelineOptions po;
  const std::string dir = TempDir("disk");
  CacheRequest req = CacheRequest::For(Llama1BForward());
  req.options = po.CacheOptions();
  const Binding b = {{"batch", 8}, {"seq", 2048}};
  (void)Open(dir)->GetOrCompile(req, b, Compiler(Llama1BForward(), po)).value();
  int64_t disk_hits = 0;
  for (auto _ : state) {
    auto cache = Open(dir);  // fresh object: as after a process restart
    benchmark::DoNotOptimize(cache->GetOrCompile(req, b, Compiler(Llama1BForward(), po)).value());
    disk_hits += cache->stats().disk_hits;
  }
  state.counters["disk_hit_fraction"] = double(disk_hits) / double(state.iterations());
  if (std::system(absl::StrCat("rm -rf ", dir).c_str()) != 0) state.SkipWithError("cleanup failed");
}
BENCHMARK(BM_WarmHitDisk)->Unit(benchmark::kMillisecond);

// Modes: 0 static shapes; 1 seq varies (symbolic); 2 batch and seq vary (both symbolic);
// for comparison, on the same trace as 2: 3 both bucketed (powers of two), 4 both concrete.
void BM_HitRateTrace(benchmark::State& state) {
  const int mode = int(state.range(0));
  // Modes 3-4 compile many times: a small model keeps them quick; hit rates do not depend on it.
  static const Graph* tiny = new Graph(BuildLlamaForward(LlamaConfig::Tiny()).value());
  const Graph& fwd = mode <= 2 ? Llama1BForward() : *tiny;
  PipelineOptions po;
  CacheRequest req = CacheRequest::For(fwd);
  req.options = po.CacheOptions();
  const char* label[] = {"static", "one symbolic dim (seq)", "several symbolic dims (batch, seq)",
                         "batch, seq bucketed pow2", "batch, seq concrete"};
  switch (mode) {
    case 0:
      req.policy = {{"batch", DimPolicy::Concrete()}, {"seq", DimPolicy::Concrete()}};
      break;
    case 1:
      req.policy = {{"batch", DimPolicy::Concrete()}};
      break;
    case 3:
      req.policy = {{"batch", DimPolicy::Bucketed()}, {"seq", DimPolicy::Bucketed(128)}};
      break;
    case 4:
      req.policy = {{"batch", DimPolicy::Concrete()}, {"seq", DimPolicy::Concrete()}};
      break;
    default:
      break;
  }
  CacheStats stats;
  for (auto _ : state) {
    auto cache = Open("");
    std::mt19937_64 rng(1234);
    std::uniform_int_distribution<int64_t> batch(1, 16), seq(16, 4096);
    for (int step = 0; step < 1000; ++step) {
      Binding b = {{"batch", 8}, {"seq", 2048}};
      if (mode >= 1) b["seq"] = seq(rng);
      if (mode >= 2) b["batch"] = batch(rng);
      auto a = cache->GetOrCompile(req, b, Compiler(fwd, po));
      if (!a.ok()) {
        state.SkipWithError(std::string(a.status().message()).c_str());
        return;
      }
    }
    stats = cache->stats();
  }
  state.SetLabel(label[mode]);
  state.counters["hit_rate"] = stats.hit_rate();
  state.counters["compiles"] = double(stats.misses);
  state.counters["compile_s"] = stats.compile_seconds;
  std::printf("trace %-36s hit rate %.1f%%  real compiles %lld  (%s)\n", label[mode],
              100 * stats.hit_rate(), static_cast<long long>(stats.misses), stats.ToJson().substr(0, 160).c_str());
}
BENCHMARK(BM_HitRateTrace)->DenseRange(0, 4)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace sg::graph
