"""dsv41 adapter (testbed copy): prefetch Engram rows one step ahead (DSV41_ENGRAM_PREFETCH_CHECK=1 re-runs the sync path).
Gate: DSV41_ENGRAM_PREFETCH."""
GATE = "DSV41_ENGRAM_PREFETCH"
