"""warmshell: a control plane for AI-agent sandboxes with warm pools and verified identity."""

__all__ = ["__version__"]

__version__ = "0.1.0"
