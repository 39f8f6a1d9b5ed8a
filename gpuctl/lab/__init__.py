"""The lab fleet: real sshd on loopback, simulated GPUs."""
