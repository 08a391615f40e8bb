"""The supervisor: the first process in every sandbox. Register -> wait for activation -> run the
workload -> hold the session. Imports only grpc and the generated stubs, to start fast. A leaf:
imported only where it is started (the CLI, and the local driver's supervising); what the gateway
and the local runtime share with it is `warmshell.sandboxio`."""
