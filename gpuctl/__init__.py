"""gpuctl: keep a GPU fleet busy."""

__version__ = "0.1.0"
