"""Clusters in one SimPy environment: replicas behind a router, P/D pools, data parallel ranks."""
