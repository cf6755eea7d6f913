"""The engine every driver shares, its specifications and step pricing, and the SimPy replay."""
