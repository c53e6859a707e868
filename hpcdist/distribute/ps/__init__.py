"""Parameter servers over MPI: roles, the server loop, the client, and remote variables."""
