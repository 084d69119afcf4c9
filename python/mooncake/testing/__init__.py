"""Test utilities shared by the component test suites (not part of the public API)."""
