"""kubesim: a simulated Kubernetes for tests and benchmarks.

Part 1 is the API server (``kubesim.apiserver``); the agent-sandbox controllers and a kubelet talk to
it over HTTP like real components do. kubesim never imports warmshell.
"""

__all__: list[str] = []
