"""The gate's orchestration: the layered suite and the checks as one timed command (run), its test
models shared between tests (models), its time table (timing), GPUs and workers (devices), test
order (run_order), the persistent compile cache (compile_cache) and inductor's CPU probe (vec_isa)."""
