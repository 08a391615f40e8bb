"""The warmshell Python SDK (its client lands separately; `files` is its file operations)."""
