"""Workloads and side-by-side benchmark commands."""
