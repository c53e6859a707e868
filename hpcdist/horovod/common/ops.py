"""Horovod's reduce operations: ``Average``, ``Sum``, ``Adasum``, ``Min``, ``Max``,
``Product`` (the same numbers in every framework module).

Example:
    >>> OP_NAMES[Sum]
    'Sum'
"""

Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
#: The name of each op.
OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
            Product: "Product"}
#: The engine op of each (Average is MEAN for floats; integers sum and floor-divide).
ENGINE_OP = {Sum: "SUM", Min: "MIN", Max: "MAX", Product: "PRODUCT", Adasum: "ADASUM"}
