"""One module per `servelab` subcommand: each parses its flags, composes the packages, prints."""
