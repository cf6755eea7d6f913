"""The servelab command line: parses arguments, composes the packages, prints."""
