"""The engine core: one thread owns the kvstore manager, the scheduler and the compute backend."""
