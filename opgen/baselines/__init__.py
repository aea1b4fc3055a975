"""Baseline implementations that ``opgen bench`` times side by side with a generated op."""
