"""Device cost profiles, trace replay, offline budget selection and the per-window oracle (seed 000 §4.3)."""
