"""Who is calling: API key and admin token formats, prefix-cache scopes."""
