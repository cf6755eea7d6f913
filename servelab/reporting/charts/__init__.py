"""Charts: matplotlib figures drawn from result tables."""
