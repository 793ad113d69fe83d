"""Rewriting: patterns (sequence variables, AC sums) and the engine that applies rulesets and
strategies, memoised over the shared graph, with its step and size limits."""
