"""mooncake.tools: planning tools (KV-cache size calculator, hit-rate simulator, trace replay)."""
