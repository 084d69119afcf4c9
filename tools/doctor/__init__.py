"""`mooncake doctor`: a preflight of this host for a Mooncake configuration (see README.md)."""
