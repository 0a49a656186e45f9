"""Finds the CUDA Toolkit and NCCL on the machine and exposes them as @local_cuda.

Looks in $CUDA_PATH (default /usr/local/cuda) for nvcc, the runtime headers and static cudart, and
in $NCCL_HOME, then the CUDA tree, then /usr for nccl.h and libnccl.so. When CUDA is not found the
repository still exists: its libraries are empty and CUDA_FOUND is False, so the same tree builds
CPU-only. Set CUDA_PATH to a missing directory to hide CUDA on a machine that has it.
"""

def _first_existing(ctx, candidates):
    for c in candidates:
        if c and ctx.path(c).exists:
            return c
    return None

def _cuda_configure_impl(ctx):
    cuda_path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nccl_home = ctx.os.environ.get("NCCL_HOME", "")
    nvcc = cuda_path + "/bin/nvcc"
    found = (ctx.path(nvcc).exists and
             ctx.path(cuda_path + "/include/cuda_runtime.h").exists)
    cudart_dir = _first_existing(ctx, [
        cuda_path + "/lib64/libcudart_static.a",
        cuda_path + "/lib/libcudart_static.a",
    ])
    found = found and cudart_dir != None
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)
    if not found:
        print("CUDA not found under %s (CUDA_PATH): building CPU-only" % cuda_path)
        ctx.file("defs.bzl", "CUDA_FOUND = False\nNVCC = \"\"\nCUDA_PATH = \"\"\n")
        ctx.file("BUILD.bazel", "\n".join([
            "package(default_visibility = [\"//visibility:public\"])",
            "exports_files([\"defs.bzl\"])",
            "cc_library(name = \"cudart\")",
            "cc_library(name = \"cublaslt\")",
            "cc_library(name = \"nccl\")",
            "",
        ]))
        return
    lib_dir = cudart_dir.rsplit("/", 1)[0]
    nccl_header = _first_existing(ctx, [
        nccl_home + "/include/nccl.h" if nccl_home else None,
        cuda_path + "/include/nccl.h",
        "/usr/include/nccl.h",
    ])
    nccl_lib = _first_existing(ctx, [
        nccl_home + "/lib/libnccl.so" if nccl_home else None,
        cuda_path + "/lib/libnccl.so",
        cuda_path + "/lib64/libnccl.so",
        "/usr/lib/x86_64-linux-gnu/libnccl.so",
    ])
    ctx.symlink(cuda_path + "/include", "include")
    nccl_rule = "cc_library(name = \"nccl\")"
    if nccl_header and nccl_lib:
        nccl_lib_dir = nccl_lib.rsplit("/", 1)[0]
        nccl_inc_dir = nccl_header.rsplit("/", 1)[0]
        if nccl_inc_dir != cuda_path + "/include":
            ctx.symlink(nccl_header, "nccl_include/nccl.h")
            nccl_hdrs = "[\"nccl_include/nccl.h\"], includes = [\"nccl_include\"]"
        else:
            nccl_hdrs = "[]"
        nccl_rule = """cc_library(
    name = "nccl",
    hdrs = %s,
    linkopts = ["-L%s", "-Wl,-rpath,%s", "-lnccl"],
    defines = ["SG_WITH_NCCL=1"],
    deps = [":cudart"],
)""" % (nccl_hdrs, nccl_lib_dir, nccl_lib_dir)
    else:
        print("NCCL not found (NCCL_HOME, %s, /usr): building without NCCL" % cuda_path)
    ctx.file("defs.bzl", "CUDA_FOUND = True\nNVCC = \"%s\"\nCUDA_PATH = \"%s\"\n" % (nvcc, cuda_path))
    ctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

cc_library(
    name = "cudart",
    srcs = ["{lib_dir}/libcudart_static.a"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
    defines = ["SG_WITH_CUDA=1"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "cublaslt",
    linkopts = ["-L{abs_lib_dir}", "-Wl,-rpath,{abs_lib_dir}", "-lcublasLt"],
    deps = [":cudart"],
)

{nccl_rule}
""".replace("{lib_dir}", "lib").replace("{abs_lib_dir}", lib_dir).replace("{nccl_rule}", nccl_rule))
    ctx.symlink(lib_dir, "lib")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH", "NCCL_HOME"],
    local = True,
)
