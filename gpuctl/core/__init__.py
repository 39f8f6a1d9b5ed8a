"""The pure core: values in, values out. No I/O, no clock, no randomness, no UI or SSH imports."""
