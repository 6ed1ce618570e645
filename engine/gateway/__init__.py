"""Every model call: prompts, answer schemas and their lenient reading, the call ledger, keys,
context windows and prices, provider limits, and the offline heuristic model.

The only package that imports litellm, and only lazily (on the first model call), so
``keepstep status`` never pays for it (tests/test_import_boundaries.py).
"""
