"""dsv41 adapter (testbed copy): wo_a fp8 twins for TP3's four local groups (local file: never replace with the TP4 one).
Gate: DSV41_WO_A_W8."""
GATE = "DSV41_WO_A_W8"
LOCAL_TP3_GROUPS = 4
