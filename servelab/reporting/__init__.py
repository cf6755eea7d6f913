"""Tables, charts and the report: everything that reads results and draws them."""
