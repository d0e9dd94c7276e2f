"""dsv41 adapter (testbed copy): cap verification by draft confidence (e.g. conf:0.1).
Gate: DSV41_VERIFY_CAP."""
GATE = "DSV41_VERIFY_CAP"
