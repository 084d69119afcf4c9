"""Transport and platform plugins: one source set, built as a linked-in library and as a loadable .so.

`mc_plugin` makes both forms of a plugin (see transfer_engine/plugin/README.md):
  :<name>                    cc_library, alwayslink: linked into a binary, its MC_TRANSPORT_PLUGIN /
                             MC_PLATFORM_PLUGIN line registers it at static initialisation (tests, built-ins).
  :libmc_<kind>_<name>.so    the same sources compiled with -DMC_PLUGIN_SHARED_OBJECT: exports only the C entry
                             point mc_plugin_v1; the engine's plugin loader dlopens it from mooncake/_plugins/ or
                             MC_PLUGIN_DIR.
`mc_plugin_so` is the .so half alone (for a hand-written entry point, e.g. the loader's test plugins).
`mc_build_id` computes MC_PLUGIN_BUILD_ID (transfer_engine/plugin/BUILD.bazel uses it once).
"""

PLUGIN_KINDS = ["transport", "platform"]

_VERSION_SCRIPT = "//transfer_engine/plugin:plugin.lds"

def mc_plugin_so(name, srcs, deps = [], copts = [], linkopts = [], link_inputs = [], local_defines = [],
                 visibility = None, testonly = False, tags = []):
    """A plugin shared object `name` (must be libmc_*.so, the loader's pattern).

    Everything is linked statically into it (its own copy of the core code it uses); only the entry point is
    exported: -fvisibility=hidden for its sources, --exclude-libs,ALL for archives, and the version script
    //transfer_engine/plugin:plugin.lds for everything (Bazel hands gold the deps' objects between --start-lib /
    --end-lib, which --exclude-libs does not cover). -z defs makes a symbol the .so would expect from the host
    process fail the link instead of the dlopen.

    Args:
      name: file name, libmc_<kind>_<plugin>.so.
      srcs: sources (and private headers).
      deps: cc_library deps, linked statically.
      copts: extra compile options.
      linkopts: extra link options.
      link_inputs: files the linkopts name with $(location) (additional_linker_inputs).
      local_defines: extra defines for srcs.
      visibility: of the target.
      testonly: Bazel testonly.
      tags: Bazel tags.
    """
    if not (name.startswith("libmc_") and name.endswith(".so")):
        fail("%s: a plugin .so must be named libmc_<kind>_<name>.so (the loader's pattern)" % name)
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps,
        copts = ["-fvisibility=hidden", "-fvisibility-inlines-hidden"] + copts,
        local_defines = local_defines,
        linkopts = [
            "-Wl,--exclude-libs,ALL",
            "-Wl,--version-script=$(location %s)" % _VERSION_SCRIPT,
            "-Wl,-z,defs",
        ] + linkopts,
        additional_linker_inputs = [_VERSION_SCRIPT] + link_inputs,
        linkshared = True,
        linkstatic = True,
        visibility = visibility,
        testonly = testonly,
        tags = tags,
    )

def mc_plugin(name, kind, srcs, hdrs = [], deps = [], copts = [], linkopts = [], so_linkopts = [],
              so_link_inputs = [], visibility = None, testonly = False, tags = []):
    """A transport or platform plugin in both forms: `:<name>` (alwayslink) and `:libmc_<kind>_<name>.so`.

    Exactly one source must use MC_TRANSPORT_PLUGIN (kind "transport") or MC_PLATFORM_PLUGIN (kind
    "platform") from //transfer_engine/plugin:plugin.h, which is added to deps.

    Args:
      name: the plugin's target name (conventionally its transport/platform name).
      kind: "transport" or "platform".
      srcs: sources.
      hdrs: headers (public headers of the library; private sources of the .so).
      deps: deps of both forms (the .so links them statically).
      copts: compile options of both forms.
      linkopts: link options of both forms.
      so_linkopts: link options of the .so only.
      so_link_inputs: files so_linkopts name with $(location).
      visibility: of both targets.
      testonly: Bazel testonly.
      tags: Bazel tags of both targets.
    """
    if kind not in PLUGIN_KINDS:
        fail("%s: kind must be one of %s, not %r" % (name, PLUGIN_KINDS, kind))
    all_deps = deps + ["//transfer_engine/plugin"]
    native.cc_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        deps = all_deps,
        copts = copts,
        linkopts = linkopts,
        alwayslink = True,
        visibility = visibility,
        testonly = testonly,
        tags = tags,
    )
    mc_plugin_so(
        name = "libmc_%s_%s.so" % (kind, name),
        srcs = srcs + hdrs,
        deps = all_deps,
        copts = copts,
        linkopts = linkopts + so_linkopts,
        link_inputs = so_link_inputs,
        local_defines = ["MC_PLUGIN_SHARED_OBJECT"],
        visibility = visibility,
        testonly = testonly,
        tags = tags,
    )

def _mc_build_id_impl(ctx):
    headers = {}
    for dep in ctx.attr.deps:
        for f in dep[CcInfo].compilation_context.headers.to_list():
            path = f.short_path
            if f.basename == ctx.attr.exclude:
                continue
            for d in ctx.attr.dirs:
                if path.startswith(d + "/"):
                    headers[path] = f
    for f in ctx.files.srcs:
        if f.basename != ctx.attr.exclude:
            headers[f.short_path] = f
    if not headers:
        fail("%s: no header matched %s" % (ctx.label, ctx.attr.dirs))
    names = sorted(headers.keys())
    args = ctx.actions.args()
    args.add(ctx.outputs.out)
    args.add(ctx.outputs.inputs_list)
    args.add(ctx.var["COMPILATION_MODE"])  # opt / fastbuild / dbg objects differ: plugins must match the host
    args.add_all(["%s=%s" % (n, headers[n].path) for n in names])

    # One line per header, "<sha256 of its bytes> <workspace path>", in path order; the id is the first 16 hex
    # digits of the sha256 of those lines followed by "compilation_mode <opt|fastbuild|dbg>".
    ctx.actions.run_shell(
        inputs = [headers[n] for n in names],
        outputs = [ctx.outputs.out, ctx.outputs.inputs_list],
        arguments = [args],
        command = """set -eu
out=$1; list=$2; mode=$3; shift 3
for pair in "$@"; do
  printf '%s %s\\n' "$(sha256sum < "${pair#*=}" | cut -d' ' -f1)" "${pair%%=*}"
done > "$list"
id=$({ cat "$list"; echo "compilation_mode $mode"; } | sha256sum | cut -c1-16)
{
  echo '// Generated by //transfer_engine/plugin:build_id (bazel/plugin.bzl); do not edit.'
  echo '// sha256 over the SDK headers listed in build_id_inputs.txt beside this file, shortened to 16 hex digits.'
  echo '#ifndef MOONCAKE_TRANSFER_ENGINE_PLUGIN_BUILD_ID_H_'
  echo '#define MOONCAKE_TRANSFER_ENGINE_PLUGIN_BUILD_ID_H_'
  echo "#define MC_PLUGIN_BUILD_ID \\"$id\\""
  echo '#endif  // MOONCAKE_TRANSFER_ENGINE_PLUGIN_BUILD_ID_H_'
} > "$out"
""",
        mnemonic = "McBuildId",
        progress_message = "Hashing the plugin SDK headers for %s" % ctx.outputs.out.short_path,
    )
    return [DefaultInfo(files = depset([ctx.outputs.out]))]

mc_build_id = rule(
    implementation = _mc_build_id_impl,
    doc = """Writes `out`, defining MC_PLUGIN_BUILD_ID: the first 16 hex digits of the sha256 of the lines
"<sha256 of the file> <workspace path>" (sorted by path) of every header under `dirs` that `deps` carry
(transitively) plus `srcs`, except files named `exclude`. Also writes `inputs_list` (those lines).""",
    attrs = {
        "out": attr.output(mandatory = True),
        "inputs_list": attr.output(mandatory = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "srcs": attr.label_list(allow_files = [".h"]),
        "dirs": attr.string_list(mandatory = True),
        "exclude": attr.string(default = "build_id.h"),
    },
)
