"""Compute backends: what runs a step's chunks and samples their next tokens (torch, sim)."""
