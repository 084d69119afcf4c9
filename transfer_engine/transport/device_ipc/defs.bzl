"""The checks every device-IPC transport plugin (nvlink_intra, hip, nvlink) runs on its .so."""

load("//bazel:defs.bzl", "mc_py_test")

def device_ipc_plugin_checks(transport, missing, env, own_network = True, tags = [],
                             vendor_libraries = "libcuda|libcudart|libnvidia|libamdhip|libhsa|libascendcl|libmusa"):
    """:no_vendor_needed_test and :<transport>_python_test for :libmc_transport_<transport>.so.

    Args:
      transport: the plugin's name (its folder is transfer_engine/transport/<transport>).
      missing: text the plugin's probe reason contains without the emulation (DEVICE_IPC_MISSING).
      env: the python test's environment (MC_PLATFORM_EMULATION, DEVICE_IPC_PROTOCOL, ...; see
        device_ipc_python_test.py); DEVICE_IPC_TRANSPORT and DEVICE_IPC_MISSING are added.
      own_network: run the python test in a private network namespace (False: it makes its own "hosts").
      tags: of the python test ("exclusive": outside the sandbox, where /run/netns is writable).
      vendor_libraries: the sonames (a regex alternation of prefixes) the .so must not NEED.
    """
    so = ":libmc_transport_%s.so" % transport

    # The .so NEEDs no vendor library (the runtime is only dlopen'ed by the probe) and exports the entry point.
    native.sh_test(
        name = "no_vendor_needed_test",
        size = "small",
        srcs = ["//transfer_engine/platform/testing:no_vendor_needed_test.sh"],
        args = ["'^(%s)'" % vendor_libraries, "$(rootpath %s)" % so],
        data = [so],
    )

    # Two processes, the plugin loaded from its .so (MC_PLUGIN_DIR) by the Python engine, on the host emulation.
    mc_py_test(
        name = "%s_python_test" % transport,
        size = "medium",
        srcs = ["//transfer_engine/transport/device_ipc:device_ipc_python_test.py"],
        data = [so],
        env = dict(env, DEVICE_IPC_MISSING = missing, DEVICE_IPC_TRANSPORT = transport),
        own_network = own_network,
        tags = tags,
        deps = [
            "//python:engine",
            "//python:testing",
        ],
    )
