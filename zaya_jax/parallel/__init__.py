"""Device mesh, sharding rules and expert parallelism."""
