"""Compute drivers: where sandboxes actually run (local processes, Kubernetes)."""
