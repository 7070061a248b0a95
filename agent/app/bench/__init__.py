"""`agent bench`: how often each lane vendor fixes production-style bugs through the real fixer path, at what cost.

``cases`` reads and validates case files, ``run`` runs case x vendor x repeat (each in its own process and home,
resumable), ``report`` turns result folders into fix rates with confidence intervals.
"""
