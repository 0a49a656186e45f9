#include "kernels/autotune/tuning_table.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::kernels::autotune {
namespace {

// Arbitrary bytes, including NUL and high bytes, like a cublasLtMatmulAlgo_t's 64.
std::string RandomBytes(size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = char(testing::Rng()() & 0xff);
  return s;
}

TuningKey Key(const std::string& device, int m) {
  return {"gemm.cublaslt", device, "cublasLt 130000", "m=" + std::to_string(m) + ",n=2048,k=8192"};
}

TEST(TuningTable, SerializeParseRoundTripKeepsEveryByte) {
  TuningTable t;
  std::vector<std::string> blobs;
  for (int i = 0; i < 5; ++i) {
    blobs.push_back(RandomBytes(64));
    t.Put(Key(i % 2 ? "NVIDIA H200" : "NVIDIA A100", 1000 + i), Choice{blobs.back(), 10.5 + i, 8});
  }
  const std::string text = t.Serialize();
  absl::StatusOr<TuningTable> back = TuningTable::Parse(text);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 5u);
  for (int i = 0; i < 5; ++i) {
    std::optional<Choice> c = back->Find(Key(i % 2 ? "NVIDIA H200" : "NVIDIA A100", 1000 + i));
    ASSERT_TRUE(c.has_value()) << i;
    EXPECT_EQ(c->variant, blobs[i]);
    EXPECT_EQ(c->microseconds, 10.5 + i);
    EXPECT_EQ(c->candidates, 8);
  }
  EXPECT_EQ(back->Serialize(), text);
}

TEST(TuningTable, LookupNeedsTheSameDeviceAndLibrary) {
  TuningTable t;
  t.Put(Key("NVIDIA H200", 16384), Choice{"x", 1, 1});
  EXPECT_TRUE(t.Find(Key("NVIDIA H200", 16384)).has_value());
  EXPECT_FALSE(t.Find(Key("NVIDIA H100 80GB HBM3", 16384)).has_value());
  TuningKey other_lib = Key("NVIDIA H200", 16384);
  other_lib.library = "cublasLt 120900";
  EXPECT_FALSE(t.Find(other_lib).has_value());
  EXPECT_FALSE(t.Find(Key("NVIDIA H200", 16385)).has_value());
}

TEST(TuningTable, ParseRejectsBadInputNamingTheProblem) {
  EXPECT_NE(TuningTable::Parse("not json").status().message().find("does not parse"), std::string::npos);
  EXPECT_NE(TuningTable::Parse(R"({"format":"other","entries":[]})").status().message().find("sg-tuning-1"),
            std::string::npos);
  auto missing = TuningTable::Parse(R"({"format":"sg-tuning-1","entries":[{"kernel":"k"}]})");
  EXPECT_NE(missing.status().message().find("\"device\""), std::string::npos) << missing.status();
  auto not_hex = TuningTable::Parse(
      R"({"format":"sg-tuning-1","entries":[{"kernel":"k","device":"d","library":"l","problem":"p",)"
      R"("variant":"zz","us":1,"candidates":1}]})");
  EXPECT_NE(not_hex.status().message().find("not hex"), std::string::npos) << not_hex.status();
}

TEST(PickFastest, ChoosesTheFastestAndSkipsFailures) {
  const int n = 6;
  std::vector<double> times(n);
  for (double& t : times) t = 5.0 + double(testing::Rng()() % 1000) / 10.0;
  const int fail = int(testing::Rng()() % n);
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if (i != fail && (best < 0 || times[i] < times[best])) best = i;
  }
  absl::StatusOr<Choice> c = PickFastest(
      n,
      [&](int i) -> absl::StatusOr<double> {
        if (i == fail) return absl::InternalError("no");
        return times[i];
      },
      [](int i) { return "v" + std::to_string(i); });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->variant, "v" + std::to_string(best));
  EXPECT_EQ(c->microseconds, times[best]);
  EXPECT_EQ(c->candidates, n - 1);

  auto none = PickFastest(2, [](int) -> absl::StatusOr<double> { return absl::InternalError("bad algo"); },
                          [](int) { return std::string(); });
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("bad algo"), std::string::npos);
}

// Costs a candidate by the milliseconds `run` reports for a fixed number of calls, as an energy
// meter's joules follow a call's time at the power limit; counts its uses.
class SustainedTimeMeter : public CostMeter {
 public:
  std::string unit() const override { return "ms"; }
  absl::StatusOr<double> CostPerCall(const std::function<absl::StatusOr<double>(int64_t)>& run,
                                     double us_per_call) override {
    ++uses;
    last_us = us_per_call;
    absl::StatusOr<double> ms = run(kCalls);
    if (!ms.ok()) return ms.status();
    return *ms / kCalls;
  }
  static constexpr int64_t kCalls = 7;
  int uses = 0;
  double last_us = 0;
};

TEST(PickCheapest, ReranksTheFastFewByTheMeter) {
  // Few-call times (us) and, per call, what the meter sees (ms). Candidate 0 fails to run; 1 is the
  // fastest; 2, 4 and 5 are within 1.15x of it; 3 is not, though the meter would like it best.
  const std::vector<double> us = {0, 200, 210, 260, 205, 229};
  std::vector<double> sustained(6);
  for (double& s : sustained) s = 0.3 + double(testing::Rng()() % 100) / 1000.0;  // 0.3 - 0.4 ms
  sustained[2] = 0.25;
  sustained[3] = 0.1;
  std::vector<int> runs(6, 0);
  auto measure = [&](int i) -> absl::StatusOr<double> {
    if (i == 0) return absl::InternalError("candidate 0 cannot run this problem");
    return us[size_t(i)];
  };
  auto run = [&](int i, int64_t calls) -> absl::StatusOr<double> {
    ++runs[size_t(i)];
    EXPECT_EQ(calls, SustainedTimeMeter::kCalls);
    return sustained[size_t(i)] * double(calls);
  };
  auto variant = [](int i) { return "v" + std::to_string(i); };
  SustainedTimeMeter meter;
  RerankPolicy policy;
  policy.min_us = 150;
  policy.within = 1.15;
  policy.max_candidates = 3;  // 1, 4, 2 in time order; 5 is within 1.15x but fourth
  absl::StatusOr<Choice> c = PickCheapest(6, measure, variant, run, &meter, policy);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->variant, "v2");
  EXPECT_EQ(c->microseconds, 210);
  EXPECT_EQ(c->candidates, 5);
  EXPECT_EQ(c->cost_unit, "ms");
  EXPECT_DOUBLE_EQ(c->cost, 0.25);
  EXPECT_DOUBLE_EQ(c->fastest_cost, sustained[1]);
  EXPECT_EQ(meter.uses, 3);
  EXPECT_EQ(runs, (std::vector<int>{0, 1, 1, 0, 1, 0}));

  // With room for every candidate, 5 is metered too; 3 still is not (260 > 1.15 x 200).
  policy.max_candidates = 10;
  sustained[5] = 0.2;
  c = PickCheapest(6, measure, variant, run, &meter, policy);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->variant, "v5");
  EXPECT_EQ(runs[3], 0);

  // A problem faster than min_us keeps the time's choice and never reaches the meter.
  policy.min_us = 201;
  const int uses = meter.uses;
  c = PickCheapest(6, measure, variant, run, &meter, policy);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->variant, "v1");
  EXPECT_TRUE(c->cost_unit.empty());
  EXPECT_EQ(meter.uses, uses);

  // No meter: PickFastest's answer.
  absl::StatusOr<Choice> plain = PickCheapest(6, measure, variant, run, nullptr);
  absl::StatusOr<Choice> fastest = PickFastest(6, measure, variant);
  ASSERT_TRUE(plain.ok() && fastest.ok());
  EXPECT_EQ(*plain, *fastest);
}

TEST(PickCheapest, ReturnsTheMetersErrorWhenItFailsOnEveryCandidate) {
  SustainedTimeMeter meter;
  auto c = PickCheapest(
      3, [](int i) -> absl::StatusOr<double> { return 300.0 + i; }, [](int i) { return std::to_string(i); },
      [](int, int64_t) -> absl::StatusOr<double> { return absl::UnavailableError("NVML went away"); }, &meter);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("NVML went away"), std::string::npos);
  EXPECT_EQ(meter.uses, 3);
  EXPECT_EQ(PickCheapest(0, nullptr, nullptr, nullptr, &meter).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TuningTable, MeteredChoicesKeepTheirCostsThroughText) {
  TuningTable t;
  Choice metered{RandomBytes(64), 1234.5, 8, "J", 0.8125, 0.9};
  Choice timed{RandomBytes(64), 88, 8};
  t.Put(Key("NVIDIA H200", 1), metered);
  t.Put(Key("NVIDIA H200", 2), timed);
  absl::StatusOr<TuningTable> back = TuningTable::Parse(t.Serialize());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back->Find(Key("NVIDIA H200", 1)), metered);
  EXPECT_EQ(*back->Find(Key("NVIDIA H200", 2)), timed);
  // Only the metered entry writes cost fields.
  const std::string text = t.Serialize();
  const size_t first = text.find("\"cost_unit\"");
  EXPECT_NE(first, std::string::npos);
  EXPECT_EQ(text.find("\"cost_unit\"", first + 1), std::string::npos);

  auto half = TuningTable::Parse(
      R"({"format":"sg-tuning-1","entries":[{"kernel":"k","device":"d","library":"l","problem":"p",)"
      R"("variant":"00","us":1,"candidates":1,"cost_unit":"J"}]})");
  EXPECT_EQ(half.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(half.status().message().find("\"cost\""), std::string::npos) << half.status();
}

TEST(Tuner, KeepsItsMeterAndPolicy) {
  Tuner t;
  EXPECT_EQ(t.meter(), nullptr);
  auto meter = std::make_shared<SustainedTimeMeter>();
  RerankPolicy p;
  p.min_us = 500;
  t.set_meter(meter, p);
  EXPECT_EQ(t.meter().get(), meter.get());
  EXPECT_EQ(t.rerank_policy().min_us, 500);
  t.set_meter(nullptr);
  EXPECT_EQ(t.meter(), nullptr);
}

TEST(Tuner, TunesOncePerKeyAndReusesInstalledChoices) {
  Tuner t;
  int calls = 0;
  auto tune = [&]() -> absl::StatusOr<Choice> {
    ++calls;
    return Choice{"algo" + std::to_string(calls), 3.0, 4};
  };
  auto a = t.GetOrTune(Key("NVIDIA H200", 1), tune);
  auto b = t.GetOrTune(Key("NVIDIA H200", 1), tune);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(a->variant, b->variant);
  EXPECT_EQ(t.tunings(), 1);

  // A "second process": a fresh Tuner with the first one's table installed never tunes that key,
  // but does tune the same problem on another device.
  Tuner fresh;
  absl::StatusOr<TuningTable> table = TuningTable::Parse(t.Snapshot().Serialize());
  ASSERT_TRUE(table.ok());
  fresh.Install(*table);
  const int before = calls;
  auto c = fresh.GetOrTune(Key("NVIDIA H200", 1), tune);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->variant, a->variant);
  EXPECT_EQ(calls, before);
  EXPECT_EQ(fresh.tunings(), 0);
  auto d = fresh.GetOrTune(Key("NVIDIA A100-SXM4-80GB", 1), tune);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(calls, before + 1);
  EXPECT_EQ(fresh.tunings(), 1);

  // A failed tuning is returned and not recorded.
  auto e = fresh.GetOrTune(Key("NVIDIA H200", 2), []() -> absl::StatusOr<Choice> {
    return absl::UnavailableError("busy");
  });
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(fresh.Find(Key("NVIDIA H200", 2)).has_value());
}

TEST(Tuner, EnvVariableTurnsAutotuneOff) {
  ::unsetenv("SG_AUTOTUNE");
  EXPECT_TRUE(AutotuneAllowedByEnv());
  ::setenv("SG_AUTOTUNE", "0", 1);
  EXPECT_FALSE(AutotuneAllowedByEnv());
  ::setenv("SG_AUTOTUNE", "Off", 1);
  EXPECT_FALSE(AutotuneAllowedByEnv());
  ::setenv("SG_AUTOTUNE", "1", 1);
  EXPECT_TRUE(AutotuneAllowedByEnv());
  ::unsetenv("SG_AUTOTUNE");
}

}  // namespace
}  // namespace sg::kernels::autotune
