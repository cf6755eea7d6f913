"""Speculative decoding in the scheduler: proposals per row, verification, accept and roll back."""
