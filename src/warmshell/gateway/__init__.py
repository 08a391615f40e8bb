"""The gateway: public API, supervisor API, store, registry, activation, reconcilers, metrics."""
