"""dsv41 adapter (testbed copy): fence folded results before verification.
Gate: DSV41_FOLDED_FENCE."""
GATE = "DSV41_FOLDED_FENCE"
