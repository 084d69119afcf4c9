"""`mooncake soak`: a chaos soak of engines and store clients over network-namespace hosts (README.md)."""
