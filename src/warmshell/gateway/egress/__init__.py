"""The gateway's egress proxy: a sandbox's only way out, checked against its policy
(`warmshell.core.egress`) host-side, where the workload cannot reach it."""
