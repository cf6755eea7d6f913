"""Trace file formats: readers, the format detector and writers."""
