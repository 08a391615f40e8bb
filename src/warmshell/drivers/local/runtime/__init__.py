"""The isolation runtime of the local driver: start one isolated sandbox (bubblewrap, seccomp,
cgroups, limits, its own uid, a staged /etc, the C agent as pid 1) and talk to its agent. It knows
nothing of pools, the fleet or the gateway (a contract in pyproject.toml says so).
"""
