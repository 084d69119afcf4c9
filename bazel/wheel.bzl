"""mc_wheel: one rule for every wheel variant (CPU now; accelerator variants add their plugins and name)."""

load("@local_python//:defs.bzl", "PY_TAG")

def mc_wheel(name, distribution, version, files, package_dirs = {}, requires = [], extras = {},
             console_scripts = {}, summary = "", readme = None, platform = "linux_x86_64"):
    """Assembles `<distribution>-<version>-<py>-<py>-<platform>.whl` with //bazel:build_wheel.

    Args:
      name: target name.
      distribution: distribution name, e.g. "mooncake-transfer-engine-non-cuda".
      version: version string.
      files: {path inside the wheel: label of one file}.
      package_dirs: {directory inside the wheel ("mooncake/tools/"): (package folder, filegroup label)};
        each file keeps its path relative to the package folder (source and generated files alike).
      requires: Requires-Dist entries.
      extras: {extra name: [requirements]}.
      console_scripts: {script: "module:function"}.
      summary: one-line description.
      readme: label of a Markdown file used as the long description.
      platform: platform tag.
    """
    wheel = "%s-%s-%s-%s-%s.whl" % (distribution.replace("-", "_"), version, PY_TAG, PY_TAG, platform)
    args = [
        "--out $@",
        "--name " + distribution,
        "--version " + version,
        "--tag %s-%s-%s" % (PY_TAG, PY_TAG, platform),
        "--summary '%s'" % summary,
    ]
    srcs = []
    if readme:
        args.append("--readme $(location %s)" % readme)
        srcs.append(readme)
    args += ["--requires '%s'" % r for r in requires]
    for extra, reqs in extras.items():
        args.append("--extra " + extra)
        args += ["--requires '%s; extra == \"%s\"'" % (r, extra) for r in reqs]
    args += ["--console-script %s=%s" % (s, target) for s, target in console_scripts.items()]
    for dest, label in files.items():
        args.append("%s=$(location %s)" % (dest, label))
        srcs.append(label)
    for directory, (root, label) in package_dirs.items():
        args.append("$$(for f in $(locations %s); do echo %s:%s=$$f; done)" % (label, directory, root))
        srcs.append(label)
    native.genrule(
        name = name,
        srcs = srcs,
        outs = [wheel],
        cmd = "$(location //bazel:build_wheel) " + " ".join(args),
        tools = ["//bazel:build_wheel"],
    )
