// Runs a libFuzzer entry point (LLVMFuzzerTestOneInput) without libFuzzer: every file of a corpus
// directory, then random mutations of them for a bounded time. This is how CI exercises the fuzz
// targets with gcc; `--config=fuzz` builds the same entry points as real libFuzzer binaries.
//
//   // in <target>_fuzz_test (a cc_test): deps on the fuzz entry's library and //fuzz:replay_main,
//   // copts = ['-DSG_FUZZ_CORPUS=\"trainer/safetensors/fuzz_corpus/safetensors\"'].
//
// SG_FUZZ_REPLAY_SECONDS (default 3) bounds the mutation phase; the seed is printed (SG_TEST_SEED
// replays it), and a crashing input is written to $TEST_UNDECLARED_OUTPUTS_DIR (or /tmp) first.
#ifndef SGTRAIN_FUZZ_REPLAY_H_
#define SGTRAIN_FUZZ_REPLAY_H_

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#endif  // SGTRAIN_FUZZ_REPLAY_H_
