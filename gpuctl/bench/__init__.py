"""Benchmarks that read files: the openb trace replay under the FGD paper's protocol.

Not part of the pure core: this package loads CSVs, draws seeded random numbers and measures wall
time. Placement decisions themselves come from `gpuctl.core.placement.policies`.
"""
