"""dsv41 adapter (testbed copy): draft lm_head in fp8.
Gate: DSV41_DRAFT_HEAD_FP8."""
GATE = "DSV41_DRAFT_HEAD_FP8"
