"""Generated wire contract (see proto/warmshell/v1)."""
