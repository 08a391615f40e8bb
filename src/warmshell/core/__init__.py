"""Pure domain: identifiers, quantities, validation, fingerprints, models and phases (no I/O)."""
