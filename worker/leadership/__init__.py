"""Leadership: the election (:mod:`.elector`, :mod:`.static`) and the leader-only work it starts."""
