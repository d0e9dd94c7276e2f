"""dsv41 adapter (testbed copy): block-wise verification of draft tokens.
Gate: DSV41_BLOCK_VERIFY."""
GATE = "DSV41_BLOCK_VERIFY"
