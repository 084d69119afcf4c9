"""Wheels: `mc_wheel` assembles one wheel; `mc_wheel_variant` makes a per-accelerator variant of a shared file set;
`mc_wheel_variants` makes several plus filegroups of their wheels and manifests.

A variant = the shared files + its plugins (in mooncake/_plugins/, where the engine's plugin loader looks) + its
device code at fixed paths + its own distribution name and summary. Version and platform tag are the shared ones.
"""

load("@local_python//:defs.bzl", "PY_TAG")

def mc_wheel(name, distribution, version, files, package_dirs = {}, requires = [], extras = {},
             console_scripts = {}, summary = "", readme = None, platform = "linux_x86_64", visibility = None):
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
      visibility: of the target.
    """
    if "'" in summary:
        fail("%s: the summary must not contain a single quote (it is passed through the shell)" % name)
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
        visibility = visibility,
    )

PLUGIN_DIR = "mooncake/_plugins/"

def _basename(label):
    return label.split(":")[-1].split("/")[-1]

def mc_wheel_variant(name, common, distribution, summary, plugins = [], device_files = {}, extra_requires = [],
                     device_code = "none", compile_only = "", visibility = None):
    """One wheel variant `name` (the .whl) plus `name + "_manifest"` (`<name>.variant.json`, what it carries).

    Args:
      name: target name of the wheel.
      common: the shared set: dict(version, files, package_dirs, requires, extras, console_scripts, readme);
        `files` must not already hold a path a variant adds.
      distribution: the distribution name ("mooncake-transfer-engine-cuda13").
      summary: the metadata summary line (say what the variant carries and what it lacks).
      plugins: labels of single plugin libraries, each named libmc_*.so (the loader's pattern); installed as
        mooncake/_plugins/<file name>.
      device_files: {path inside the wheel: label of one file} for device code (kernels) of this variant.
      extra_requires: Requires-Dist entries added to the shared ones.
      device_code: for the manifest and tests: how the variant gets its device code ("none", "nvcc 13.0 ...").
      compile_only: for the manifest and tests: why the accelerator code cannot run on the build machine
        ("" when everything the variant carries runs here).
      visibility: of both targets.

    The manifest is written from these arguments, not from the wheel, so //python:wheels_test can check the
    wheel against it.
    """
    files = dict(common["files"])
    for label in plugins:
        base = _basename(label)
        if not (base.startswith("libmc_") and base.endswith(".so")):
            fail("%s: plugin %s must be a file named libmc_*.so (the plugin loader's pattern)" % (name, label))
        dest = PLUGIN_DIR + base
        if dest in files:
            fail("%s: two plugins install as %s" % (name, dest))
        files[dest] = label
    for dest, label in device_files.items():
        if dest in files:
            fail("%s: device file %s is already a file of the wheel" % (name, dest))
        files[dest] = label
    platform = common.get("platform", "linux_x86_64")
    mc_wheel(
        name = name,
        distribution = distribution,
        version = common["version"],
        files = files,
        package_dirs = common.get("package_dirs", {}),
        requires = common.get("requires", []) + extra_requires,
        extras = common.get("extras", {}),
        console_scripts = common.get("console_scripts", {}),
        summary = summary,
        readme = common.get("readme"),
        platform = platform,
        visibility = visibility,
    )
    manifest = json.encode({
        "distribution": distribution,
        "wheel": "%s-%s-%s-%s-%s.whl" % (distribution.replace("-", "_"), common["version"], PY_TAG, PY_TAG, platform),
        "summary": summary,
        "plugins": sorted([PLUGIN_DIR + _basename(label) for label in plugins]),
        "device_files": sorted(device_files.keys()),
        "device_code": device_code,
        "compile_only": compile_only,
    })
    native.genrule(
        name = name + "_manifest",
        outs = [name + ".variant.json"],
        cmd = "cat > $@ <<'EOF'\n%s\nEOF" % manifest.replace("$", "$$"),
        visibility = visibility,
    )

def mc_wheel_variants(name, common, variants, visibility = None):
    """Every variant of `variants` (dicts of mc_wheel_variant's arguments but `common`), plus the filegroups
    `name` (their wheels) and `name + "_manifests"` (their manifests)."""
    for variant in variants:
        mc_wheel_variant(common = common, visibility = visibility, **variant)
    native.filegroup(name = name, srcs = [":" + v["name"] for v in variants], visibility = visibility)
    native.filegroup(
        name = name + "_manifests",
        srcs = [":%s_manifest" % v["name"] for v in variants],
        visibility = visibility,
    )
