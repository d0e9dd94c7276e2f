"""dsv41 adapter (testbed copy): keep FlashInfer autotune caches across boots when every rank's .launch sidecar matches.
Gate: DSV41_AUTOTUNE_KEEP."""
GATE = "DSV41_AUTOTUNE_KEEP"
