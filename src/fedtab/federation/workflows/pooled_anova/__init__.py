"""Pooled ANOVA selection from per-class sums: the pooled selector's mask under any label skew."""
