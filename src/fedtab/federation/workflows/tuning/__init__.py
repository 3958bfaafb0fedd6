"""Freedom-degree tuning as a federated workflow (engine-independent)."""
