"""The supervisor: the first process in every sandbox. Register -> wait for activation -> run the
workload -> hold the session. Imports only grpc and the generated stubs, to start fast."""
