"""Adapters: the edges of gpuctl (SSH, NVML probe, files, clock), each behind a protocol we own."""
