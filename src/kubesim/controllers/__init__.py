"""The agent-sandbox controllers (Sandbox, SandboxTemplate, SandboxWarmPool, SandboxClaim), simulated.

They talk to kubesim's API server only over HTTP (``client``), through list+watch informers and
optimistic-lock writes, as the upstream controller-runtime controllers do. Decisions live in the pure
modules (``rendering``, ``conditions``, ``pools``, ``claims``); the reconcilers fetch, decide, write.
"""
