"""mooncake.ep's CUDA platform: kernels (ep_kernels.cu), the device interface (device.py), its host emulation
for tests (emulation.py), and the GPU data path of Buffer (path.py)."""
