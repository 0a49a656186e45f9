"""Repositories for the system libraries the project uses, all from Debian's -dev packages.

Nothing is downloaded: each repository checks that its package's files are on the machine (failing
with the package name and the `./bazelw` hint when they are not), links the headers it needs into the
repository, and writes a BUILD file from third_party/system/<name>.BUILD.
"""

_LIBDIR = "/usr/lib/x86_64-linux-gnu"

def _system_library_impl(ctx):
    missing = [f for f in ctx.attr.required_files if not ctx.path(f).exists]
    if missing:
        fail(("system library '%s' is missing %s; install Debian's %s " +
              "(./bazelw installs it, or: apt-get install -y %s)") %
             (ctx.name, ", ".join(missing), ctx.attr.package, ctx.attr.package))
    for link, target in ctx.attr.symlinks.items():
        ctx.symlink(target, link)
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)
    ctx.template("BUILD.bazel", ctx.attr.build_file, {"%{libdir}": _LIBDIR})

system_library = repository_rule(
    implementation = _system_library_impl,
    attrs = {
        "package": attr.string(mandatory = True, doc = "Debian package that provides the files"),
        "required_files": attr.string_list(doc = "absolute paths that must exist"),
        "symlinks": attr.string_dict(doc = "path in the repository -> absolute path on the machine"),
        "build_file": attr.label(mandatory = True, allow_single_file = True),
    },
    local = True,
)

def system_libraries():
    """Declares every system library repository. Called once from WORKSPACE."""
    system_library(
        name = "com_google_absl",
        package = "libabsl-dev",
        required_files = ["/usr/include/absl/status/status.h", _LIBDIR + "/libabsl_status.a"],
        build_file = Label("//third_party/system:absl.BUILD"),
    )
    system_library(
        name = "eigen",
        package = "libeigen3-dev",
        required_files = ["/usr/include/eigen3/Eigen/Core"],
        symlinks = {"Eigen": "/usr/include/eigen3/Eigen", "unsupported": "/usr/include/eigen3/unsupported"},
        build_file = Label("//third_party/system:eigen.BUILD"),
    )
    system_library(
        name = "com_google_googletest",
        package = "libgtest-dev",
        required_files = ["/usr/include/gtest/gtest.h", _LIBDIR + "/libgtest.a"],
        build_file = Label("//third_party/system:gtest.BUILD"),
    )
    system_library(
        name = "com_github_google_benchmark",
        package = "libbenchmark-dev",
        required_files = ["/usr/include/benchmark/benchmark.h", _LIBDIR + "/libbenchmark.so"],
        build_file = Label("//third_party/system:benchmark.BUILD"),
    )
    system_library(
        name = "ucx",
        package = "libucx-dev",
        required_files = ["/usr/include/ucp/api/ucp.h", _LIBDIR + "/libucp.so"],
        build_file = Label("//third_party/system:ucx.BUILD"),
    )
    system_library(
        name = "nlohmann_json",
        package = "nlohmann-json3-dev",
        required_files = ["/usr/include/nlohmann/json.hpp"],
        build_file = Label("//third_party/system:json.BUILD"),
    )
    system_library(
        name = "sentencepiece",
        package = "libsentencepiece-dev",
        required_files = ["/usr/include/sentencepiece_processor.h", _LIBDIR + "/libsentencepiece.so"],
        build_file = Label("//third_party/system:sentencepiece.BUILD"),
    )
