// A libmc_*.so without the entry point mc_plugin_v1.
extern "C" __attribute__((visibility("default"))) int mc_not_a_plugin() { return 0; }
