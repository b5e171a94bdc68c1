"""What the user wrote, validated before anything connects: the inventory and the launch plan.

Pure: nothing here opens a connection or starts a process.

- `yamlines.py`  YAML with the line of every key, duplicate keys refused
- `schema.py`    every key of the inventory, its type and default; the plain and pydantic validators
- `inventory.py` the frozen `Inventory`: ranges expanded, defaults merged, cross-field rules
- `plan.py`      node ranks, world size, each node's exact torchrun argv and environment
"""
