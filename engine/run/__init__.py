"""The commit protocol against the Store (DESIGN §5–8): the run loop, one attempt, gates,
recovery, approvals, side effects and their adapters, budgets, replay, takeover.

``runtime.py`` defines ``Project`` and ``Run``, what every module here and in ``report/`` is
given; ``loop.py`` schedules units, ``runner.py`` claims, runs and commits one;
``attempt.py`` is one unit's execution context.
"""
