"""The project's build rules: C++ flags, test/benchmark macros, and the CUDA rule.

A package's BUILD file loads only this file:

    load("//tools:defs.bzl", "sg_cc_library", "sg_cc_test", "sg_cuda_library")
    sg_cuda_library(name = "rmsnorm_cuda", srcs = ["rmsnorm.cu"], deps = [":rmsnorm_hdrs"])

CUDA files are compiled by nvcc (from @local_cuda) into objects that a cc_library links; when CUDA
is absent or `--config=nocuda` is set, a CUDA library is empty and code guards on SG_WITH_CUDA.
"""

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "NVCC")

# Project code: C++17, all warnings, warnings are errors. Not applied to third_party.
SG_COPTS = [
    "-std=c++17",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
    # GCC 12 reports false positives inside Abseil's InlinedVector at -O2 (-c opt).
    "-Wno-maybe-uninitialized",
]

# Tests and binaries link statically: Bazel's per-library shared objects miss cudart's symbols.
def sg_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = SG_COPTS + copts, **kwargs)

def sg_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = SG_COPTS + copts, linkstatic = True, **kwargs)

def sg_cc_test(name, copts = [], deps = [], size = "small", **kwargs):
    """A GoogleTest test; `deps` need not name gtest. Runs in CI (`bazel test //...`)."""
    native.cc_test(
        name = name,
        copts = SG_COPTS + copts,
        linkstatic = True,
        size = size,
        deps = deps + ["@com_google_googletest//:gtest_main"],
        **kwargs
    )

def sg_cc_benchmark(name, copts = [], deps = [], tags = [], **kwargs):
    """A Google Benchmark binary. Not a test: run it with `bazel run` or on the GPU machine."""
    native.cc_binary(
        name = name,
        copts = SG_COPTS + copts,
        linkstatic = True,
        deps = deps + ["@com_github_google_benchmark//:benchmark_main"],
        tags = tags + ["benchmark"],
        **kwargs
    )

# --- user-defined string build settings (Bazel 4 has no skylib here) -----------------------------

StringSettingInfo = provider(fields = ["value"])

def _string_setting_impl(ctx):
    return [StringSettingInfo(value = ctx.build_setting_value)]

string_setting = rule(
    implementation = _string_setting_impl,
    build_setting = config.string(flag = True),
)

# --- CUDA -----------------------------------------------------------------------------------------

def _gencode_flags(archs):
    flags = []
    for arch in [a.strip() for a in archs.split(",") if a.strip()]:
        if not arch.startswith("sm_"):
            fail("--//tools:cuda_archs: expected entries like sm_90a, found '%s'" % arch)
        num = arch[len("sm_"):]
        flags.append("-gencode=arch=compute_%s,code=sm_%s" % (num, num))

        # PTX for the plain architecture, so newer GPUs can JIT it.
        plain = num.rstrip("a")
        flags.append("-gencode=arch=compute_%s,code=compute_%s" % (plain, plain))
    return flags

def _nvcc_objects_impl(ctx):
    cc_info = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps])
    comp = cc_info.compilation_context
    root = ctx.label.workspace_root or "."
    flags = ["-std=c++17", "-O3", "--expt-relaxed-constexpr", "-Xcompiler=-fPIC,-Wall",
             "-Werror=all-warnings", "-I" + root, "-I" + ctx.bin_dir.path + "/" + root]
    flags += _gencode_flags(ctx.attr._archs[StringSettingInfo].value)
    flags += ["-D" + d for d in comp.defines.to_list()]
    flags += ["-I" + p for p in comp.quote_includes.to_list() + comp.includes.to_list()]
    flags += ["-isystem=" + p for p in comp.system_includes.to_list()]
    flags += ctx.attr.nvcc_flags
    flags += [f for f in ctx.attr._extra[StringSettingInfo].value.split(" ") if f]
    inputs = depset(ctx.files.srcs + ctx.files.hdrs, transitive = [comp.headers])
    outs = []
    for src in ctx.files.srcs:
        stem = ctx.attr.name + "/" + src.basename[:-len(".cu")]
        pic = ctx.actions.declare_file(stem + ".pic.o")
        ctx.actions.run_shell(
            inputs = inputs,
            outputs = [pic],
            # A private TMPDIR per action: nvcc names its temporary files after its process id
            # (/tmp/tmpxft_<pid>_...), and inside Bazel's sandboxes (one pid namespace each) those
            # ids repeat, so parallel nvcc actions sharing /tmp overwrote or removed each other's
            # files ("cc1plus: fatal error: /tmp/tmpxft_00000002_...: No such file").
            command = ('tmp="$(mktemp -d)" && TMPDIR="$tmp" "$1" "${@:4}" -c "$2" -o "$3"; ' +
                       'rc=$?; rm -rf "$tmp"; exit $rc'),
            arguments = [NVCC, src.path, pic.path] + flags,
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        outs.append(pic)
    return [DefaultInfo(files = depset(outs))]

_nvcc_objects = rule(
    implementation = _nvcc_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "nvcc_flags": attr.string_list(),
        "_archs": attr.label(default = "//tools:cuda_archs"),
        "_extra": attr.label(default = "//tools:nvcc_flags"),
    },
)

def sg_cuda_library(name, srcs, hdrs = [], deps = [], nvcc_flags = [], visibility = None, **kwargs):
    """A cc_library of CUDA (.cu) sources compiled by nvcc for --//tools:cuda_archs.

    `deps` supply headers (and are linked); `hdrs` are headers private to the .cu files. Empty when
    CUDA is absent or `--config=nocuda` is set: callers guard on SG_WITH_CUDA.
    """
    if not CUDA_FOUND:
        native.cc_library(name = name, deps = deps, visibility = visibility, **kwargs)
        return
    cuda_deps = deps + ["//third_party/cuda:cudart"]
    _nvcc_objects(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = cuda_deps,
        nvcc_flags = nvcc_flags,
        visibility = ["//visibility:private"],
        tags = ["manual"],  # built only through the select below, so --config=nocuda skips nvcc
    )
    native.cc_library(
        name = name,
        srcs = select({
            "//third_party/cuda:cuda_disabled": [],
            "//conditions:default": [":" + name + "_nvcc"],
        }),
        deps = cuda_deps,
        visibility = visibility,
        **kwargs
    )
