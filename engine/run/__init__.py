"""The commit protocol against the Store (DESIGN §5–8): the run loop, one attempt, gates,
recovery, approvals, side effects and their adapters, budgets, replay, takeover.

``handle.py`` is the read side every module here and in ``report/`` is given; ``loop.py``
claims, runs and commits units; ``attempt.py`` is one unit's execution context.
"""
