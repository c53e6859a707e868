"""Tests on a real NVIDIA GPU (CuPy, Numba CUDA, NCCL); every one is skipped, with the reason
shown by ``pytest -rs tests/gpu``, where no usable GPU exists."""
