"""The allocation engine: the node's address state, who owns what, and the only code that changes it."""
