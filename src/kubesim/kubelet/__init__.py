"""kubesim's kubelet and scheduler: pods become real local processes (see ``kubelet.kubelet``)."""
