"""sg_fuzz_target: a libFuzzer entry point as a fuzzer binary (manual, --config=fuzz) and a
corpus-replay test that CI runs with the default compiler.

    sg_fuzz_target(name = "safetensors", srcs = ["safetensors_fuzz.cc"], deps = [":safetensors"])
    # -> :safetensors_fuzz_lib, :safetensors_fuzzer (tags manual, fuzz), :safetensors_fuzz_test
    # corpus: fuzz_corpus/safetensors/
"""

load("//tools:defs.bzl", "sg_cc_binary", "sg_cc_library", "sg_cc_test")

def sg_fuzz_target(name, srcs, deps = [], replay_seconds = "3"):
    corpus = "fuzz_corpus/" + name
    sg_cc_library(
        name = name + "_fuzz_lib",
        srcs = srcs,
        deps = deps + ["//fuzz:replay_hdrs"],
        alwayslink = True,
        testonly = True,
    )
    sg_cc_binary(
        name = name + "_fuzzer",
        deps = [":" + name + "_fuzz_lib"],
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual", "fuzz"],
        testonly = True,
    )
    sg_cc_test(
        name = name + "_fuzz_test",
        srcs = ["//fuzz:replay_main.cc"],
        copts = ["-DSG_FUZZ_CORPUS=\\\"%s/%s\\\"" % (native.package_name(), corpus)],
        data = native.glob([corpus + "/**"]),
        env = {"SG_FUZZ_REPLAY_SECONDS": replay_seconds},
        deps = [
            ":" + name + "_fuzz_lib",
            "//fuzz:replay_hdrs",
            "//kernels/core:testing",
            "@com_google_absl//:absl",
        ],
    )
