"""HTTP transport defences, who is calling, and the one mapping of errors to HTTP answers."""
