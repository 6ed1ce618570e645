"""Pure: the plan, the loaded facts, the decision, changes, invalidation and explanations.

Nothing here touches a store, a file, a clock or a model: every function takes values and
returns values, so it can be tested exhaustively (tests/test_decide.py, test_invalidation.py).
Importing it loads no storage backend (tests/test_import_boundaries.py).
"""
