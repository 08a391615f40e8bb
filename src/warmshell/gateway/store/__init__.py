"""Durable object store: one `objects` table, every write compare-and-swap on resource_version."""
