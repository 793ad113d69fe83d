"""Learning: metrics (the duals of a 1-form), flow (a form's flow under its metric), train (the
flow followed step by step) and watch (logs, CSV and plots of what is watched)."""
