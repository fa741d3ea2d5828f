"""Building and running the server: settings, flags, the app factory, start-up and drain."""
