"""The Kubernetes driver's pool profiles: the reconciler that renders them into warm pools, its
plan, and the Lease that elects the replica running it."""
