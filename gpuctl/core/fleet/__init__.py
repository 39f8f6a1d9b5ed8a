"""The fleet rules, pure: the fleet view placement reads from a snapshot, gpuctl's allocations and
the store's cordons (`view`: ghost memory, schedulability), a node's state in the design's words
(`nodestate`: ready, cordoned, draining, down, unknown), the target workload fragmentation is
measured against (`workload`) and the five numbers as one value (`numbers`). The utilization band
they read is `gpuctl.core.band`, beside the placement that admits work against it.
"""
