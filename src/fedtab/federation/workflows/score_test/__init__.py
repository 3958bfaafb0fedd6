"""Pooled forward selection by score tests: the multivariate signal a marginal test misses."""
