// Stands in for a vendor library at link time only (soname libmc_missing_vendor.so.1); never installed.
extern "C" __attribute__((visibility("default"))) int mc_missing_vendor_version() { return 1; }
