"""Sandbox I/O: what the supervisor, the local driver's runtime and the gateway share about a
sandbox's processes, output and files — the process seam (`processes.Runner`, `OutputSink`, and
`run_streaming` for a supervisor's own children), exec input and terminals (`interactive`;
`terminals`, a pseudo-terminal of the sandbox's own devpts opened through its root), the output
window (`window`), confined file access under a sandbox's root (`rootfs`), how a supervisor
reaches the gateway (`link`), and how it talks to a sandbox's agent (`agentwire`, the records;
`agentlink`, the link over an inherited socket or one accepted by `agentlisten`). It sits between
`core` and its users and imports neither.
"""
