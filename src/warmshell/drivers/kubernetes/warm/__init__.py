"""The Kubernetes driver's warm path: the extensions gate, the pool cache, the SandboxClaims it
writes and their activation."""
