"""Checking fdsl against independent oracles: check (``fdsl rules --check``, each rule against its
sides' values), differential (every gradient path against finite differences and torch) and fuzz
(random models through the differential checks; Hypothesis is an extra, imported only here)."""
